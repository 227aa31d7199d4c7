// JSON parsing that refuses a repeated key. nlohmann::json keeps the last of
// two equal keys in an object and says nothing, so {"name": "a", "name": "b"}
// would be policy b, and a second "rollout" in a policy's defaults would
// override the first unseen. Every JSON document the daemon reads (policies,
// safetensors headers, --config files) goes through here instead, and its
// caller names the repeated key in its error. Header-only: the rooms that parse
// JSON link nlohmann_json themselves.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mxserve {

// nlohmann's parse error without the text it quotes: what() is "[json.exception.
// parse_error.101] parse error at line 1, column 6: syntax error while parsing
// object key - invalid literal; last read: '...'; expected string literal", and
// the "last read" is the document's own bytes (a safetensors header the client
// may not read otherwise). Kept: where, and what kind of error.
inline std::string JsonSyntaxErrorWithoutText(absl::string_view what) {
  const size_t tag_end = what.find("] ");
  if (tag_end != absl::string_view::npos) what.remove_prefix(tag_end + 2);
  const size_t dash = what.find(" - ");
  if (dash == absl::string_view::npos) return std::string(what.substr(0, what.find(':')));
  const size_t reason_end = what.find(';', dash);
  return std::string(what.substr(0, reason_end));
}

// Parses `text` like nlohmann::json::parse without letting an exception out
// (invalid JSON: a discarded value, and *syntax_error, when given, says where and
// why, without quoting it: "parse error at line 3, column 1: syntax error while
// parsing object - unexpected end of input").
// Where some object repeats a key, *repeated is set to the first such key's path
// ("defaults.rollout", "rules[2].match"), and the value returned is what nlohmann
// made of it (the last copy won): the caller refuses it.
inline nlohmann::json ParseJsonRefusingRepeats(absl::string_view text, std::string* repeated,
                                               std::string* syntax_error = nullptr) {
  using Json = nlohmann::json;
  repeated->clear();
  if (syntax_error != nullptr) syntax_error->clear();
  // One frame per open object or array: an object's keys so far and the key of
  // the value being read; an array's index of the element being read.
  struct Frame {
    bool array = false;
    int64_t index = 0;
    std::string key;
    std::set<std::string, std::less<>> keys;
  };
  std::vector<Frame> open;
  const auto path_to = [&](absl::string_view last) {
    std::string path;
    for (size_t i = 0; i < open.size(); ++i) {
      const Frame& frame = open[i];
      const bool innermost = i + 1 == open.size();
      if (frame.array) {
        path.append("[").append(std::to_string(frame.index)).append("]");
      } else {
        if (!path.empty()) path.append(".");
        if (innermost) {
          path.append(last.data(), last.size());
        } else {
          path.append(frame.key);
        }
      }
    }
    return path;
  };
  // A value of an array finished: the next one is the array's next element.
  const auto element_done = [&] {
    if (!open.empty() && open.back().array) ++open.back().index;
  };
  const Json::parser_callback_t track = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case Json::parse_event_t::array_start:
        open.emplace_back().array = true;
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        Frame& object = open.back();
        if (!object.keys.insert(key).second && repeated->empty()) *repeated = path_to(key);
        object.key = key;
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        open.pop_back();
        element_done();
        break;
      case Json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), track, /*allow_exceptions=*/true);
  } catch (const Json::parse_error& e) {
    if (syntax_error != nullptr) *syntax_error = JsonSyntaxErrorWithoutText(e.what());
  } catch (const Json::exception&) {
    if (syntax_error != nullptr) {
      *syntax_error = "a value JSON parsing cannot hold (a number out of range?)";
    }
  }
  return Json(Json::value_t::discarded);
}

}  // namespace mxserve
