// A private redis-server for one test or benchmark process.
//
// Starts `redis-server` from PATH in a fresh mkdtemp directory, listening on a unix socket there
// and on a free TCP port of 127.0.0.1, with persistence off; waits until it answers PING; kills
// it and removes the directory on destruction; bounded memory (`maxmemory 64mb`, policy
// `volatile-ttl`, what the client requires by default) unless `extra_args` override it; it also
// dies with the test process. Tests use kill()/restart(), stop()/resume() to inject faults. A
// missing redis-server is an error (`start()` returns it), never a skip.
//
//   sluice_test::RedisServer server;
//   REQUIRE(server.start().empty());   // empty = started; else the reason
//   options.connection.unix_socket = server.unix_socket();
//
// Thread-safety: use from one thread.
#ifndef SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP_
#define SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP_

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace sluice_test {

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisServer {
 public:
  RedisServer() = default;
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() {
    shutdown();
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }

  // Starts the server; returns "" on success, else why it could not.
  std::string start() {
    if (!dir_.empty()) return launch();
    std::string pattern = (std::filesystem::temp_directory_path() / "sluice-redis-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return "mkdtemp failed";
    dir_ = pattern;
    // The port was free a moment ago, but another test running at the same time may bind it
    // first: the server then exits at startup saying so, and it starts again on another port
    // (at most five tries).
    std::string error;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      if (port_ == 0) return "no free TCP port on 127.0.0.1";
      error = launch();
      if (error.empty() || !port_was_taken()) break;
    }
    return error;
  }

  // SIGKILL, as a crash: the socket file stays, connections break.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  std::string restart() {
    kill();
    return launch();
  }
  void stop() { ::kill(pid_, SIGSTOP); }  // the process freezes; the kernel still accepts
  void resume() { ::kill(pid_, SIGCONT); }

  // More command-line settings for the next start() or restart(), e.g. {"--maxmemory", "0"};
  // later settings win over the defaults.
  void set_extra_args(std::vector<std::string> args) { extra_args_ = std::move(args); }

  const std::string& unix_socket() const { return socket_; }
  int port() const { return port_; }

  // Runs one command on a fresh connection (for setup and inspection).
  Reply command(std::initializer_list<std::string_view> args) const {
    redisContext* c = redisConnectUnix(socket_.c_str());
    if (c == nullptr) return nullptr;
    if (c->err != 0) {
      redisFree(c);
      return nullptr;
    }
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    redisFree(c);
    return Reply(reply);
  }

  // Every key in the database (SCAN until the cursor returns to 0).
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    std::string cursor = "0";
    do {
      Reply r = command({"SCAN", cursor, "COUNT", "1000"});
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) break;
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (size_t i = 0; i < r->element[1]->elements; ++i) {
        out.emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
      }
    } while (cursor != "0");
    return out;
  }

  // A TCP port of 127.0.0.1 that was free a moment ago (0 if none).
  static int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    close(fd);
    return port;
  }

 private:
  // The first executable `name` on PATH, or "".
  static std::string find_in_path(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
    while (!rest.empty()) {
      const std::size_t colon = rest.find(':');
      std::string candidate(rest.substr(0, colon));
      candidate += "/" + name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
    return "";
  }

  std::string launch() {
    const std::string binary = find_in_path("redis-server");
    if (binary.empty()) {
      return "redis-server is not on PATH: install it (Debian: apt-get install redis-server)";
    }
    socket_ = dir_ + "/redis.sock";
    const std::string port = std::to_string(port_);
    const std::string log = dir_ + "/redis.log";
    std::vector<std::string> args = {binary,
                                     "--port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--unixsocket",
                                     socket_,
                                     "--unixsocketperm",
                                     "700",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--logfile",
                                     log,
                                     "--daemonize",
                                     "no",
                                     "--maxmemory",
                                     "64mb",
                                     "--maxmemory-policy",
                                     "volatile-ttl"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) {
      pid_ = 0;
      return "fork failed";
    }
    if (pid_ == 0) {
      // The child: dies with the test process (even one a sanitizer ends), holds none of its
      // file descriptors (a pipe held open would keep CTest waiting), then becomes the server.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      const int null_fd = open("/dev/null", O_RDWR);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
      close_range(3, ~0U, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return "redis-server exited at startup; see " + log;
      }
      Reply pong = command({"PING"});
      if (pong && pong->type == REDIS_REPLY_STATUS && std::string_view(pong->str) == "PONG") {
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "redis-server did not answer PING within 10 s; see " + log;
  }

  void shutdown() { kill(); }

  // Whether the server's log says that its TCP port was taken.
  bool port_was_taken() const {
    std::ifstream log(dir_ + "/redis.log");
    for (std::string line; std::getline(log, line);) {
      if (line.find("Address already in use") != std::string::npos) return true;
    }
    return false;
  }

  std::string dir_;
  std::string socket_;
  std::vector<std::string> extra_args_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP_
