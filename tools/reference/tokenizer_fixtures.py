#!/usr/bin/env python3
"""Parity fixtures for Myriad's byte-level BPE tokenizers (src/data/bpe.cpp).

  tokenizer_fixtures.py [OUT]     writes OUT (default tests/fixtures/tokenizers/)

Nothing is downloaded. The script trains small byte-level BPE vocabularies with `tokenizers` on
local text (WordNet glosses under /usr/share/wordnet when present, plus generated multilingual
text), writes them in the formats the published checkpoints ship, and records what the reference
packages produce for a fixed, seeded set of test strings:

  cases.jsonl.gz                the test strings, one JSON array a line: [category, text] or
                                [category, null, hex bytes] (invalid UTF-8: round trip only);
                                the first line is a header with the package versions
  kimi_tiktoken/                tiktoken.model + tokenizer_config.json as Kimi K2/K3 ship them
                                (Kimi's pat_str, added_tokens_decoder, 256 reserved ids);
                                expected.jsonl.gz from tiktoken.Encoding, split as Kimi's
                                tokenization_kimi.py splits (400k-char chunks, 25k-char runs)
  cl100k_tiktoken/              the same ranks with a `pat_str` override (the cl100k pattern)
  deepseek_hf/                  tokenizer.json as DeepSeek-V3 ships it (Sequence of three
                                Splits + ByteLevel(use_regex=false), "a b" merges, special and
                                non-special added tokens) + tokenizer_config.json
  gpt2_hf/                      tokenizer.json exercising the other paths: ByteLevel with
                                add_prefix_space and the GPT-2 regex, Split by a string, the
                                Removed/MergedWithPrevious/MergedWithNext/Contiguous behaviours
                                and invert, ignore_merges, added tokens with lstrip/rstrip

expected.jsonl.gz has one line per case (after its own header line): null for a case this
tokenizer is not checked on (with a "stride" in the header, only every stride-th case and all
"specials" ones, no long ones), else {"ids": [...]} for
encode() (no special token recognised; tiktoken encode_ordinary, tokenizers with
encode_special_tokens=True), "trusted": [...] when recognising special tokens changes the ids
(tiktoken allowed_special="all", tokenizers encode_special_tokens=False), "decoded": text when
the reference's decode differs from the input (a Removed split, a prefix space); {} for the
byte cases.

Run with tools/reference/.venv/bin/python (tiktoken and tokenizers as requirements.txt pins).
"""
import base64
import gzip
import json
import pathlib
import random
import sys
import unicodedata

import tiktoken
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pre
from tokenizers import trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 20240607
N_CASES = 10000

# Kimi's pre-tokenizer pattern, as tokenization_kimi.py (Kimi Linear, K2, K2.5) writes it.
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
CL100K_PAT_STR = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
KIMI_RESERVED = 256

# Named ids past the ranks, at the offsets Kimi K2's added_tokens_decoder uses.
KIMI_NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
              6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
              11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
              13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
              15: "<|tool_call_end|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}

# DeepSeek-V3's three Split regexes (its tokenizer.json holds raw CR and LF in the third).
DS_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
     " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
]
DS_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
DS_ADDED = ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<|User|>", "<|Assistant|>",
            "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁end｜>", "<think>", "</think>"]

LOOKALIKES = (list(KIMI_NAMED.values()) + DS_SPECIAL + DS_ADDED +
              ["<|im_", "<|im_end|", "[EO", "[EOS", "<|reserved_token_", "<|reserved_token_300|>",
               "<|reserved_token_4000|>", "<mask>", "<tab>", "[SEP]", "<｜", "▁", "<||>", "<|>",
               "<|endoftext|>", "<s>", "</s>", "hello world"])


# ----------------------------------------------------------------------------- test strings

def ranges(*pairs):
    out = []
    for a, b in pairs:
        out.extend(range(a, b + 1))
    return out


SCRIPTS = {
    "han": ranges((0x4E00, 0x9FFF)) + ranges((0x3400, 0x3430)),
    "kana": ranges((0x3041, 0x3096), (0x30A1, 0x30FA), (0x30FC, 0x30FC)),
    "hangul": ranges((0xAC00, 0xD7A3)),
    "arabic": ranges((0x0621, 0x064A), (0x064B, 0x0652), (0x0660, 0x0669)),
    "cyrillic": ranges((0x0410, 0x044F), (0x0401, 0x0401), (0x0451, 0x0451)),
    "devanagari": ranges((0x0905, 0x0939), (0x093E, 0x094D), (0x0966, 0x096F)),
    "thai": ranges((0x0E01, 0x0E2E), (0x0E31, 0x0E31), (0x0E34, 0x0E3A), (0x0E47, 0x0E4E),
                   (0x0E50, 0x0E59)),
    "greek": ranges((0x0391, 0x03A1), (0x03A3, 0x03C9)),
    "hebrew": ranges((0x05D0, 0x05EA)),
    "latin": [ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"],
    "accents": [ord(c) for c in "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßŒœŠšŸİıệỹĳǅǈ"] + [0x0301, 0x0308],
}
ASSIGNED = [c for c in range(0x110000)
            if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
CJK_PUNCT = "、。「」『』，！？：；（）【】《》〃々〆〇・ー～"
PUNCT = ".,;:!?-—–()[]{}\"'`~@#$%^&*_+=/\\|<>…«»¿¡"
EMOJI = ["😀", "😂", "🥲", "🤖", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇫🇷", "❤️", "1️⃣",
         "©️", "™️", "🧑🏿‍💻", "🫠", "👩‍❤️‍💋‍👨", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☃", "✨", "🔥", "#️⃣"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\u3000", "\xa0", "\x0b", "\x0c",
          "\x85", "\u2028", "\u2029", "\u200b", "\x1c", "\x1f", "\u202f", "\u205f", "\u1680",
          "\u2003", " \n", "\t\t", "\n ", "\r\n\r\n", "    "]
CONTRACTIONS = ["I'm", "you're", "it's", "IT'S", "We'LL", "they'd", "can't", "'s", "'S", "'ſ",
                "'K", "’s", "x's'", "o'clock", "rock'n'roll", "She'D", "we've", "'VE", "'re",
                "Ma'am", "'ll", "don't", "DON'T", "John's", "ŞİŞLİ'DE", "l'été", "'t", "Ǆ's"]
NUMBERS_EXTRA = ["０１２３", "٣٤٥", "१२३४", "²³", "Ⅻ", "½", "3.14159", "1e-9", "1,000,000", "0x1F",
                 "๑๒๓", "〇", "①②"]
CODE = [
    "def {a}({b}, {c}=None):\n    return {b} ** 2 + {c}  # {w}\n",
    "for (int {a} = 0; {a} < {b}; ++{a}) {{\n\t{c} += {b}[{a}];\n}}\n",
    "{{\"{a}\": [{n}, {n}, \"{w}\"], \"{b}\": null}}",
    "<div class=\"{a}\">{w}</div>\n",
    "if {a} != {b} and not {c}:\n        raise ValueError(f\"{w} {{{a}!r}}\")\n",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {c} >= {n} GROUP BY {a};",
    "```python\nimport {a}\nprint({a}.{b}({n}))\n```",
    "    {a}->{b} = std::make_unique<{c}>({n});  // {w}",
    "#include <{a}.h>\n\nstatic const char* {b} = \"{w}\\n\";\n",
    "x = [{n}, {n}]; y = x[::-1]  # -> {w}\r\n",
    "--> {a} ==> {b} !== {c} &&& ||| ... ??? !!!",
]


def wordnet_glosses():
    out = []
    root = pathlib.Path("/usr/share/wordnet")
    for name in ("data.noun", "data.verb", "data.adj", "data.adv"):
        p = root / name
        if not p.exists():
            continue
        for line in p.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:
                continue
            out.append(line.split("|", 1)[1].strip())
    return out


class Gen:
    def __init__(self, seed, english):
        self.r = random.Random(seed)
        self.english = english or ["the quick brown fox jumps over the lazy dog"]
        self.words = sorted({w for g in self.english[:20000] for w in g.split() if w.isalpha()})

    def word(self, script=None):
        r = self.r
        script = script or r.choice(list(SCRIPTS))
        if script == "latin" and self.words:
            w = r.choice(self.words)
            return w.capitalize() if r.random() < 0.2 else (w.upper() if r.random() < 0.05 else w)
        return "".join(chr(r.choice(SCRIPTS[script])) for _ in range(r.randint(1, 6)))

    def multilingual(self):
        r = self.r
        script = r.choice(list(SCRIPTS))
        parts = []
        for _ in range(r.randint(1, 12)):
            s = script if r.random() < 0.8 else None
            parts.append(self.word(s))
            if r.random() < 0.15:
                parts.append(r.choice(PUNCT + CJK_PUNCT))
        sep = "" if script in ("han", "kana", "thai") and r.random() < 0.6 else " "
        text = sep.join(parts)
        if r.random() < 0.3:
            text = r.choice(self.english) + " " + text
        return text

    def emoji(self):
        r = self.r
        parts = []
        for _ in range(r.randint(1, 6)):
            if r.random() < 0.7:
                parts.append(r.choice(EMOJI))
            else:
                parts.append(chr(r.randint(0x1F300, 0x1FAFF)))
            if r.random() < 0.5:
                parts.append(r.choice([" ", "", self.word("latin") + " ", "!", "\n"]))
        return "".join(parts)

    def whitespace(self):
        r = self.r
        parts = []
        if r.random() < 0.5:
            parts.append(r.choice(SPACES))
        for _ in range(r.randint(1, 6)):
            parts.append(r.choice([self.word(), r.choice(self.words), "x", "1", "."]))
            parts.append("".join(r.choice(SPACES) for _ in range(r.randint(1, 3))))
        if r.random() < 0.4:
            parts.pop()
        return "".join(parts)

    def digits(self):
        r = self.r
        parts = []
        for _ in range(r.randint(1, 5)):
            k = r.random()
            if k < 0.5:
                parts.append("".join(r.choice("0123456789") for _ in range(r.randint(1, 40))))
            elif k < 0.7:
                parts.append(f"{r.randint(0, 10**6)}.{r.randint(0, 999)}")
            elif k < 0.85:
                parts.append(r.choice(NUMBERS_EXTRA))
            else:
                parts.append(self.word() + str(r.randint(0, 99999)))
        return r.choice([" ", "", ", ", "\n", "-"]).join(parts)

    def code(self):
        r = self.r
        ident = lambda: r.choice(["x", "i", "foo_bar", "CamelCase", "_tmp", "n2", "ÿ", "变量",
                                  "Πi", "data", "self"])
        t = r.choice(CODE)
        return t.format(a=ident(), b=ident(), c=ident(), n=r.randint(0, 100000),
                        w=r.choice(self.english)[:40])

    def contractions(self):
        r = self.r
        parts = []
        for _ in range(r.randint(1, 6)):
            c = r.choice(CONTRACTIONS)
            if r.random() < 0.4:
                c = r.choice(self.words) + c if c.startswith(("'", "’")) else c
            parts.append(c)
        return r.choice([" ", "", "  "]).join(parts)

    def specials(self):
        r = self.r
        parts = []
        for _ in range(r.randint(1, 5)):
            k = r.random()
            if k < 0.3:
                parts.append(r.choice(LOOKALIKES))
            elif k < 0.5:  # whitespace around it (lstrip / rstrip)
                parts.append(r.choice(["", " ", "  ", "\t", "\n", "\u3000"]) + r.choice(LOOKALIKES) +
                             r.choice(["", " ", "  ", "\n", "\xa0"]))
            elif k < 0.8:
                parts.append(r.choice([self.word(), " ", "\n", "hello", "world"]))
            else:
                tok = r.choice(LOOKALIKES)
                parts.append(tok[: r.randint(1, len(tok))])
        return "".join(parts)

    def random_cp(self):
        # Mostly code points assigned in this Python's Unicode tables; some drawn from anywhere.
        r = self.r
        out = []
        for _ in range(r.randint(1, 16)):
            if r.random() < 0.85:
                out.append(chr(r.choice(ASSIGNED)))
                continue
            k = r.random()
            if k < 0.5:
                c = r.randint(0x20, 0xFFFF)
            elif k < 0.75:
                c = r.randint(0x10000, 0x2FFFF)
            elif k < 0.85:
                c = r.randint(0x30000, 0x3FFFF)
            elif k < 0.92:
                c = r.randint(0, 0x1F)
            else:
                c = r.randint(0x40000, 0x10FFFF)
            if 0xD800 <= c <= 0xDFFF:
                c = 0xFFFD
            out.append(chr(c))
        return "".join(out)

    def mixed(self):
        r = self.r
        fs = [self.multilingual, self.emoji, self.whitespace, self.digits, self.code,
              self.contractions, self.specials, self.random_cp]
        return "".join(r.choice(fs)() for _ in range(r.randint(2, 4)))

    def invalid_bytes(self):
        r = self.r
        k = r.random()
        if k < 0.3:
            return bytes(r.randint(0, 255) for _ in range(r.randint(1, 24)))
        bad = r.choice([b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80",
                        b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\x80", b"\xbf\xbf",
                        b"\xf8\x88\x80\x80\x80"])
        text = (self.mixed() if k < 0.7 else self.multilingual()).encode()
        cut = r.randint(0, len(text))
        return text[:cut] + bad + text[cut:]


CATEGORIES = [("multilingual", 2000), ("emoji", 800), ("whitespace", 1100), ("digits", 800),
              ("code", 900), ("contractions", 700), ("specials", 900), ("random_cp", 1500),
              ("mixed", 1300)]


def make_cases(english):
    g = Gen(SEED, english)
    cases = []
    for cat, n in CATEGORIES:
        f = getattr(g, cat)
        cases.extend((cat, f()) for _ in range(n))
    assert len(cases) == N_CASES
    # Long texts: documents, a run of 30k letters and one of 26k spaces (Kimi's 25k-run split),
    # a Han run and a digit run.
    for _ in range(6):
        cases.append(("long", "".join(g.mixed() for _ in range(40))))
    cases.append(("long", "ab" * 15000 + " tail"))
    cases.append(("long", "x " + " " * 26000 + "y"))
    cases.append(("long", "".join(chr(g.r.choice(SCRIPTS["han"])) for _ in range(3000))))
    cases.append(("long", "7" * 5000))
    for _ in range(300):
        cases.append(("bytes", g.invalid_bytes()))
    return cases


# ----------------------------------------------------------------------------- tokenizers

def training_text(english):
    g = Gen(SEED + 1, english)
    text = list(english)
    for cat, n in CATEGORIES:
        f = getattr(g, cat)
        text.extend(f() for _ in range(n * 2))
    return text


def bytes_of_token(s):
    dec = {v: k for k, v in enumerate_bytes_to_unicode().items()}
    return bytes(dec[c] for c in s)


def enumerate_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def train_ranks(text, vocab_size):
    """tiktoken ranks from a byte-level BPE trained with tokenizers: the 256 bytes, then the
    merges' results in merge order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    ranks = {bytes([b]): b for b in range(256)}
    for a, b in merges:
        t = bytes_of_token(a) + bytes_of_token(b)
        if t not in ranks:
            ranks[t] = len(ranks)
    return ranks


def kimi_split(s, max_run=25_000):
    """tokenization_kimi.py's _split_whitespaces_or_nonwhitespaces."""
    cur_len, cur_space, start = 0, (s[0].isspace() if s else False), 0
    for i in range(len(s)):
        now = s[i].isspace()
        if cur_space ^ now:
            cur_len, cur_space = 1, now
        else:
            cur_len += 1
            if cur_len > max_run:
                yield s[start:i]
                start, cur_len = i, 1
    yield s[start:]


def kimi_encode(enc, s, allow_special):
    """tokenization_kimi.py's _encode_text_piece."""
    out = []
    for i in range(0, len(s), 400_000):
        for sub in kimi_split(s[i:i + 400_000]):
            if allow_special:
                out.extend(enc.encode(sub, allowed_special="all"))
            else:
                out.extend(enc.encode(sub, disallowed_special=()))
    return out


def write_tiktoken(out, name, ranks, pat_str):
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "tiktoken.model", "w") as f:
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    n = len(ranks)
    decoder = {str(n + k): {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True} for k, v in KIMI_NAMED.items()}
    config = {"added_tokens_decoder": decoder, "bos_token": "[BOS]",
              "eos_token": {"content": "[EOS]", "__type": "AddedToken"}, "pad_token": "[PAD]",
              "unk_token": "[UNK]", "model_max_length": 1048576,
              "tokenizer_class": "TikTokenTokenizer",
              "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}
    if pat_str is not None:
        config["pat_str"] = pat_str
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    specials = {KIMI_NAMED.get(i - n, f"<|reserved_token_{i}|>"): i
                for i in range(n, n + KIMI_RESERVED)}
    enc = tiktoken.Encoding(name, pat_str=pat_str or KIMI_PAT_STR, mergeable_ranks=ranks,
                            special_tokens=specials)
    return d, enc


def train_hf(text, pre_tokenizer, vocab_size, special):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre.ByteLevel.alphabet(),
                                  special_tokens=special, show_progress=False)
    tok.train_from_iterator(text, trainer)
    return tok


def deepseek_tokenizer(out, text):
    d = out / "deepseek_hf"
    d.mkdir(parents=True, exist_ok=True)
    ptk = pre.Sequence([pre.Split(Regex(p), behavior="isolated", invert=False) for p in DS_SPLITS] +
                       [pre.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_hf(text, ptk, 4000, [AddedToken(t, special=True, normalized=True)
                                      for t in DS_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in DS_ADDED])
    j = json.loads(tok.to_str())
    # DeepSeek-V3's file: merges as "a b" strings, no ignore_merges field.
    j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
    j["model"].pop("ignore_merges", None)
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False) + "\n")
    obj = lambda c: {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": True,
                     "rstrip": False, "single_word": False}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": obj(DS_SPECIAL[0]),
              "eos_token": obj(DS_SPECIAL[1]), "pad_token": obj(DS_SPECIAL[1]), "unk_token": None,
              "legacy": True, "model_max_length": 131072,
              "tokenizer_class": "LlamaTokenizerFast"}
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return d, Tokenizer.from_file(str(d / "tokenizer.json"))


def gpt2_tokenizer(out, text):
    d = out / "gpt2_hf"
    d.mkdir(parents=True, exist_ok=True)
    ptk = pre.Sequence([
        pre.Split("--", behavior="merged_with_next"),
        pre.Split(Regex(r"[ \t]*\n"), behavior="merged_with_previous"),
        pre.Split(Regex(r"[0-9]"), behavior="contiguous"),
        pre.Split(Regex("\u200b"), behavior="removed"),
        pre.Split(Regex(r"[^;]+"), behavior="isolated", invert=True),
        pre.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok = train_hf(text, ptk, 2000, [AddedToken("<|endoftext|>", special=True)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True),
                            AddedToken("[SEP]", rstrip=True, special=True)])
    tok.add_tokens([AddedToken("<tab>", rstrip=True, lstrip=True, special=False, normalized=False),
                    AddedToken("hello world", special=False, normalized=True)])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False) + "\n")
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": None,
              "model_max_length": 1024}
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return d, Tokenizer.from_file(str(d / "tokenizer.json"))


# ----------------------------------------------------------------------------- expected ids

def write_gz_lines(path, lines):
    # mtime=0: the same content gives the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                 compresslevel=9) as f:
        for line in lines:
            f.write((json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode())


def expected_tiktoken(enc, cases, stride=None):
    rows = []
    for i, (cat, s) in enumerate(cases):
        if stride is not None and ((i % stride and cat != "specials") or cat == "long"):
            rows.append(None)  # not checked against this tokenizer
            continue
        if isinstance(s, bytes):
            rows.append({})
            continue
        ids = kimi_encode(enc, s, False)
        assert enc.decode_bytes(ids) == s.encode(), (cat, s)
        row = {"ids": ids}
        trusted = kimi_encode(enc, s, True)
        if trusted != ids:
            row["trusted"] = trusted
        rows.append(row)
    return rows


def expected_hf(tok, cases, stride=None):
    rows = []
    for i, (cat, s) in enumerate(cases):
        if stride is not None and ((i % stride and cat != "specials") or cat == "long"):
            rows.append(None)  # not checked against this tokenizer
            continue
        if isinstance(s, bytes):
            rows.append({})
            continue
        tok.encode_special_tokens = True
        ids = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        trusted = tok.encode(s, add_special_tokens=False).ids
        row = {"ids": ids}
        if trusted != ids:
            row["trusted"] = trusted
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != s:
            row["decoded"] = dec
        rows.append(row)
    return rows


def main():
    pin = {l.split("==")[0]: l.split("==")[1].strip() for l in
           (ROOT / "tools/reference/requirements.txt").read_text().splitlines()
           if "==" in l and not l.startswith("#")}
    if tiktoken.__version__ != pin.get("tiktoken"):
        print(f"warning: tiktoken {tiktoken.__version__}, requirements.txt pins {pin.get('tiktoken')}",
              file=sys.stderr)
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/tokenizers"
    out.mkdir(parents=True, exist_ok=True)
    english = wordnet_glosses()
    cases = make_cases(english)
    text = training_text(english)
    versions = {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0], "unicodedata": unicodedata.unidata_version,
                "seed": SEED}
    # unassigned: the text holds a code point unassigned in this Python's Unicode tables (14.0,
    # as PCRE2 10.42's); newer references may classify it differently.
    rows = []
    for cat, s in cases:
        if isinstance(s, bytes):
            rows.append([cat, None, s.hex()])
        else:
            un = any(unicodedata.category(c) == "Cn" for c in s)
            rows.append([cat, s, 1] if un else [cat, s])
    write_gz_lines(out / "cases.jsonl.gz", [{"versions": versions, "cases": len(cases)}] + rows)

    ranks = train_ranks(text, 3500)
    for name, pat, stride in (("kimi_tiktoken", None, None), ("cl100k_tiktoken", CL100K_PAT_STR, 5)):
        d, enc = write_tiktoken(out, name, ranks, pat)
        exp = expected_tiktoken(enc, cases, stride)
        write_gz_lines(d / "expected.jsonl.gz",
                       [{"versions": versions, "reference": "tiktoken.Encoding + Kimi splitting",
                         "stride": stride}] + exp)
        print(f"{name}: {len(ranks)} ranks, {len(exp)} cases")
    for maker, stride in ((deepseek_tokenizer, None), (gpt2_tokenizer, 5)):
        d, tok = maker(out, text)
        exp = expected_hf(tok, cases, stride)
        write_gz_lines(d / "expected.jsonl.gz",
                       [{"versions": versions, "reference": "tokenizers.Tokenizer",
                         "stride": stride}] + exp)
        print(f"{d.name}: vocab {tok.get_vocab_size()}, {len(exp)} cases")


if __name__ == "__main__":
    main()
