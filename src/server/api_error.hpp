// An error the server answers with, in OpenAI's shape: {"error": {"message", "type", "param",
// "code"}} and an HTTP status. Thrown anywhere a request is found wrong; the HTTP layer turns it
// into the response, and the server keeps serving.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace deepfuse::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt, std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  // 400 naming the request field at fault.
  static ApiError bad_field(const std::string& param, const std::string& message) {
    return ApiError(400, message, param);
  }

  nlohmann::json body() const {
    return {{"error",
             {{"message", what()},
              {"type", type},
              {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
              {"code", code ? nlohmann::json(*code) : nlohmann::json(nullptr)}}}};
  }

  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;
};

}  // namespace deepfuse::server
