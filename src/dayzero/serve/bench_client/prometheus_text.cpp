#include "dayzero/serve/bench_client/prometheus_text.h"

#include <cctype>
#include <cstdlib>
#include <optional>

namespace dz::serve {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t';
}

// One sample line "name{l="v",...} value [timestamp]" → (name, value).
std::optional<std::pair<std::string, double>> parse_sample(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && !is_space(line[i]) && line[i] != '{') ++i;
  if (i == 0) return std::nullopt;
  std::string name(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    // Label values are quoted and may hold '}' or spaces; '\' escapes inside quotes.
    bool quoted = false;
    for (++i; i < line.size(); ++i) {
      char c = line[i];
      if (quoted && c == '\\') {
        ++i;
      } else if (c == '"') {
        quoted = !quoted;
      } else if (!quoted && c == '}') {
        break;
      }
    }
    if (i >= line.size()) return std::nullopt;
    ++i;
  }
  while (i < line.size() && is_space(line[i])) ++i;
  size_t end = i;
  while (end < line.size() && !is_space(line[end])) ++end;
  if (end == i) return std::nullopt;
  std::string token(line.substr(i, end - i));
  char* parsed_end = nullptr;
  double value = std::strtod(token.c_str(), &parsed_end);  // also NaN, +Inf
  if (parsed_end != token.c_str() + token.size()) return std::nullopt;
  return std::make_pair(std::move(name), value);
}

}  // namespace

std::map<std::string, double> parse_prometheus_sums(std::string_view text) {
  std::map<std::string, double> sums;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    while (!line.empty() && (is_space(line.front()) || line.front() == '\r')) line.remove_prefix(1);
    while (!line.empty() && (is_space(line.back()) || line.back() == '\r')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    if (auto sample = parse_sample(line)) sums[sample->first] += sample->second;
  }
  return sums;
}

std::map<std::string, double> counter_deltas(const std::map<std::string, double>& before,
                                             const std::map<std::string, double>& after) {
  std::map<std::string, double> deltas;
  constexpr std::string_view kSuffix = "_total";
  for (const auto& [name, value] : after) {
    if (name.size() < kSuffix.size() ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
      continue;
    auto it = before.find(name);
    double delta = value - (it == before.end() ? 0.0 : it->second);
    if (delta != 0.0) deltas[name] = delta;
  }
  return deltas;
}

}  // namespace dz::serve
