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

}  // namespace myriad::agent
