// The environment registry (name -> factory, filled by MYRIAD_REGISTER_ENVIRONMENT during static
// initialisation) and tool_call_text, which writes a tool call exactly as the server does
// (serve::format_tool_call), so expert traces and served tool calls share one format.
#include "agent/environment.h"

#include <map>
#include <stdexcept>

#include "serve/protocol.h"

namespace myriad::agent {

namespace {

// Function-local so that registrations from other files' static initialisers find it built.
std::map<std::string, EnvironmentFactory>& registry() {
  static std::map<std::string, EnvironmentFactory> r;
  return r;
}

std::string known_names() {
  std::string s;
  for (const auto& [name, f] : registry()) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "(none)" : s;
}

}  // namespace

bool register_environment(const std::string& name, EnvironmentFactory f) {
  if (name.empty() || !f)
    throw std::invalid_argument("register_environment: empty name or factory");
  if (!registry().emplace(name, std::move(f)).second)
    throw std::invalid_argument("register_environment: '" + name + "' is already registered");
  return true;
}

std::unique_ptr<Environment> make_environment(const std::string& name) {
  const auto it = registry().find(name);
  if (it == registry().end())
    throw std::invalid_argument("unknown environment '" + name + "'; known: " + known_names());
  return it->second();
}

std::vector<std::string> environment_names() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

std::string tool_call_text(const std::string& name, const nlohmann::json& arguments) {
  return serve::format_tool_call(serve::ToolCall{"", name, arguments.dump()});
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

bool heldout_task(std::string_view task, uint64_t one_in) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : task) h = (h ^ c) * 0x100000001b3ull;
  return data::Rng(h).next() % one_in == 0;
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace myriad::agent
