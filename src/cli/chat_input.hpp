// Line input and Ctrl-C for `deepfuse chat`: Ctrl-C interrupts a reply without ending the
// program; at the prompt, Ctrl-C twice in a row (or Ctrl-D, or the end of piped input) ends it.
#pragma once

#include <optional>
#include <string>

namespace deepfuse::cli {

class ChatInput {
 public:
  // Installs the SIGINT handler, without SA_RESTART so that Ctrl-C also ends a read at the prompt.
  ChatInput();
  // Restores the handler there was before.
  ~ChatInput();
  ChatInput(const ChatInput&) = delete;
  ChatInput& operator=(const ChatInput&) = delete;

  // Prints `prompt` and reads one line from stdin, without its newline (the terminal does the
  // line editing). nullopt: the input ended (Ctrl-D, end of a pipe) or Ctrl-C came twice in a row.
  std::optional<std::string> read_line(const std::string& prompt);

  // Forgets earlier Ctrl-Cs; interrupted() then says whether one came since (a reply checks it
  // after every token).
  void arm();
  bool interrupted() const;
};

}  // namespace deepfuse::cli
