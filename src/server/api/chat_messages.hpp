// The `messages` of a chat completion request, checked against OpenAI's rules and turned into
// what the checkpoint's chat template renders.
//
// Roles: system, developer (rendered as system: chat templates predate it), user, assistant,
// tool. Content: a string or an array of parts; text parts everywhere, refusal parts in assistant
// messages; image, audio and file parts are refused by name (the models served here read text).
// An assistant message may carry `tool_calls` instead of content; a tool message needs its
// `tool_call_id`. A tool call's `arguments` (a JSON string on the wire) reach the template as the
// object they encode, because templates write them with `tojson`.
#pragma once

#include <nlohmann/json.hpp>

namespace deepfuse::server {

// `messages` of the request body (absent: a 400 naming it); the array the template renders.
nlohmann::ordered_json checked_chat_messages(const nlohmann::json& body);

}  // namespace deepfuse::server
