#include "cli/chat_input.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>

namespace deepfuse::cli {

namespace {

volatile std::sig_atomic_t ctrl_c_count = 0;  // set by the handler, read and cleared by ChatInput
struct sigaction previous_handler {};

extern "C" void on_sigint(int) { ctrl_c_count = ctrl_c_count + 1; }

void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

ChatInput::ChatInput() {
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a read() blocked at the prompt returns EINTR
  sigaction(SIGINT, &action, &previous_handler);
}

ChatInput::~ChatInput() { sigaction(SIGINT, &previous_handler, nullptr); }

std::optional<std::string> ChatInput::read_line(const std::string& prompt) {
  print(prompt);
  ctrl_c_count = 0;
  int ctrl_c_in_a_row = 0;
  std::string line;
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) {
      if (c == '\n') return line;
      line += c;
      ctrl_c_in_a_row = 0;
      continue;
    }
    if (n == 0) {  // end of input: a last line without its newline still counts
      if (line.empty()) print("\n");
      return line.empty() ? std::nullopt : std::optional<std::string>(line);
    }
    if (errno != EINTR) return std::nullopt;
    if (ctrl_c_count == 0) continue;  // another signal
    ctrl_c_count = 0;
    if (++ctrl_c_in_a_row == 2) {
      print("\n");
      return std::nullopt;
    }
    line.clear();  // the terminal dropped what was typed
    print("\n(Ctrl-C again or Ctrl-D to exit, /help for the commands)\n" + prompt);
  }
}

void ChatInput::arm() { ctrl_c_count = 0; }

bool ChatInput::interrupted() const { return ctrl_c_count > 0; }

}  // namespace deepfuse::cli
