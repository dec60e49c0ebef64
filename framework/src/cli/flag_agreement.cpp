#include "cli/flag_agreement.h"

#include "util/hash.h"

#include <boost/any.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

namespace po = boost::program_options;

namespace ddp::cli {

namespace {

const char* const kProgram = "program";
const char* const kError = "error";  // a rank whose flags were refused: its error instead

// The shortest text that reads back as `value`: different values never print alike.
std::string exact_text(double value) {
  std::string text;
  for (int digits = 6; digits <= 17; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << value;
    text = out.str();
    if (std::strtod(text.c_str(), nullptr) == value) break;
  }
  return text;
}

template <typename T>
std::optional<std::string> integer_text(const boost::any& value) {
  if (const T* v = boost::any_cast<T>(&value)) return std::to_string(*v);
  return std::nullopt;
}

// The value's text, for the types the flags use; nullopt for any other.
std::optional<std::string> value_text(const boost::any& value) {
  if (const auto* v = boost::any_cast<std::string>(&value)) return *v;
  if (const auto* v = boost::any_cast<double>(&value)) return exact_text(*v);
  if (const auto* v = boost::any_cast<float>(&value)) return exact_text(*v);
  if (const auto* v = boost::any_cast<bool>(&value)) return std::string(*v ? "true" : "false");
  if (const auto* v = boost::any_cast<std::vector<std::string>>(&value)) {
    std::string joined;
    for (const auto& item : *v) joined += (joined.empty() ? "" : ",") + item;
    return joined;
  }
  for (const auto& text :
       {integer_text<int64_t>(value), integer_text<int>(value), integer_text<long long>(value),
        integer_text<uint64_t>(value), integer_text<unsigned>(value),
        integer_text<unsigned long long>(value)}) {
    if (text) return text;
  }
  return std::nullopt;
}

std::string escape_newlines(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

// A fingerprint text back as name -> value.
std::map<std::string, std::string> settings_of(const std::string& text) {
  std::map<std::string, std::string> settings;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) settings[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return settings;
}

// "rank 3", "ranks 0,2", "ranks 0-3,5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(ranks[i]);
    if (j > i) {
      text += j == i + 1 ? "," : "-";
      text += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + text;
}

}  // namespace

std::string flags_fingerprint_text(const std::string& program, const po::variables_map& vm,
                                   const po::parsed_options& parsed) {
  std::string text = std::string(kProgram) + "=" + escape_newlines(program) + "\n";
  for (const auto& [name, variable] : vm) {  // a std::map: sorted by name
    // An option without a value (--help: Boost stores an empty string), unlike a switch (bool).
    const po::option_description* option =
        parsed.description ? parsed.description->find_nothrow(name, false) : nullptr;
    const bool valueless = option && option->semantic()->max_tokens() == 0 &&
                           !boost::any_cast<bool>(&variable.value());
    std::optional<std::string> value =
        valueless ? std::string("given") : value_text(variable.value());
    if (!value) {
      for (const auto& given : parsed.options) {
        if (given.string_key != name) continue;
        std::string tokens;
        for (const auto& token : given.original_tokens)
          tokens += (tokens.empty() ? "" : " ") + token;
        value = tokens;
      }
    }
    text += name + "=" + escape_newlines(value ? *value : "(default)") + "\n";
  }
  return text;
}

std::string flags_error_text(const std::string& program, const std::string& error) {
  return std::string(kProgram) + "=" + escape_newlines(program) + "\n" + kError + "=" +
         escape_newlines(error) + "\n";
}

std::string describe_flag_difference(const std::vector<std::string>& texts) {
  std::vector<std::map<std::string, std::string>> ranks;
  for (const std::string& text : texts) ranks.push_back(settings_of(text));
  // Every name any rank has: the program first, a refused rank's error next (its other
  // settings are unknown), then in name order.
  std::vector<std::string> names{kProgram, kError};
  std::map<std::string, bool> seen;
  for (const auto& settings : ranks) {
    for (const auto& entry : settings) seen[entry.first] = true;
  }
  for (const auto& entry : seen) {
    if (entry.first != kProgram && entry.first != kError) names.push_back(entry.first);
  }
  for (const std::string& name : names) {
    // Each distinct value (nullopt: not given) with its ranks, in order of first appearance.
    std::vector<std::pair<std::optional<std::string>, std::vector<int>>> groups;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const auto it = ranks[r].find(name);
      std::optional<std::string> value;
      if (it != ranks[r].end()) value = it->second;
      auto group = groups.begin();
      while (group != groups.end() && group->first != value) ++group;
      if (group == groups.end()) {
        groups.push_back({value, {}});
        group = groups.end() - 1;
      }
      group->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    if (name == kError) {
      for (const auto& [error, holders] : groups) {
        if (error) {
          return "the ranks were started with different flags, refused on " + rank_list(holders) +
                 ": " + *error;
        }
      }
    }
    std::string message = name == kProgram
                              ? "the ranks run different programs: "
                              : "the ranks were started with different flags: --" + name + " is ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) message += g + 1 == groups.size() ? " and " : ", ";
      const auto& value = groups[g].first;
      const std::string shown = !value ? "not given" : value->empty() ? "\"\"" : *value;
      message += shown + " on " + rank_list(groups[g].second);
    }
    return message;
  }
  return "";
}

std::string agree_on_flags(Communicator& comm, const std::string& text) {
  const uint64_t mine = hash64(text.data(), text.size());
  torch::Tensor hash = torch::empty({1}, torch::kLong);
  std::memcpy(hash.data_ptr<int64_t>(), &mine, sizeof mine);
  const torch::Tensor all = comm.all_gather(hash);
  if ((all == all[0]).all().item<bool>()) return "";
  // Different hashes: different texts, so some setting differs.
  return describe_flag_difference(all_gather_strings(comm, text));
}

}  // namespace ddp::cli
