// A private PostgreSQL 15 server for one test or benchmark process.
//
// Runs initdb in a fresh mkdtemp directory and starts `postgres` there, listening on a unix socket
// in that directory and on a free TCP port of 127.0.0.1; waits (bounded) until it accepts
// connections; stops it by pid and removes the directory on destruction; it also dies with the
// test process. initdb and postgres refuse to run as root, so under root both run as the system
// user `sluice-test`, created with useradd if missing. The binaries come from
// /usr/lib/postgresql/15/bin (Debian `postgresql`) or $SLUICE_PG_BINDIR. A missing binary is an
// error (`start()` returns it), never a skip. Tests use stop()/start() and kill() to inject faults.
//
//   sluice_test::PostgresServer server;
//   REQUIRE(server.start().empty());   // empty = started; else the reason
//   options.conninfo = server.conninfo();
//
// Thread-safety: use from one thread.
#ifndef SLUICE_TESTS_SUPPORT_POSTGRES_SERVER_HPP_
#define SLUICE_TESTS_SUPPORT_POSTGRES_SERVER_HPP_

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace sluice_test {

class PostgresServer {
 public:
  // `durable`: keep fsync and synchronous commit on (benchmarks); tests turn both off.
  explicit PostgresServer(bool durable = false) : durable_(durable) {}
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;
  ~PostgresServer() {
    stop();
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }

  // Creates the cluster (first call) and starts the server; "" on success, else why not.
  std::string start() {
    if (!dir_.empty()) return launch();
    if (std::string error = create_cluster(); !error.empty()) return error;
    // The port was free a moment ago, but another test running at the same time may bind it
    // first: the server then exits at startup saying so, and it starts again on another port
    // (at most five tries; later starts keep the port, which clients already hold).
    std::string error;
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (attempt > 0) port_ = free_port();
      if (port_ == 0) return "no free TCP port on 127.0.0.1";
      const std::uintmax_t log_before = log_size();
      error = launch();
      if (error.empty() || !port_was_taken(log_before)) break;
    }
    return error;
  }

  // Fast shutdown (SIGINT): sessions are terminated, the server exits; bounded wait, then SIGKILL.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGINT);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

  bool running() const { return pid_ > 0; }
  // The postmaster's pid (0 when stopped), to freeze it with SIGSTOP: a new connection then
  // waits for a server that accepted it and never answers.
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::string& socket_dir() const { return dir_; }
  // Over the unix socket; `tcp_conninfo()` over 127.0.0.1.
  std::string conninfo() const {
    return "host=" + dir_ + " port=" + std::to_string(port_) + " user=postgres dbname=postgres";
  }
  std::string tcp_conninfo() const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " user=postgres dbname=postgres";
  }

  // Runs `sql` on a fresh connection; "" on success, else the error (for setup and inspection).
  std::string execute(const std::string& sql, std::string* first_value = nullptr) const {
    PGconn* c = PQconnectdb(conninfo().c_str());
    std::string error;
    if (PQstatus(c) != CONNECTION_OK) {
      error = PQerrorMessage(c);
    } else {
      PGresult* r = PQexec(c, sql.c_str());
      const ExecStatusType s = PQresultStatus(r);
      if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        error = PQresultErrorMessage(r);
      } else if (first_value != nullptr) {
        *first_value = PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
      }
      PQclear(r);
    }
    PQfinish(c);
    return error;
  }

 private:
  static std::string bindir() {
    const char* env = std::getenv("SLUICE_PG_BINDIR");
    return env != nullptr ? env : "/usr/lib/postgresql/15/bin";
  }

  static int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    close(fd);
    return port;
  }

  // Under root: the unprivileged user that runs the server, created if missing.
  std::string ensure_user() {
    if (geteuid() != 0) return "";
    if (getpwnam(kUser) == nullptr) {
      run({"/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
           kUser});
    }
    const passwd* pw = getpwnam(kUser);
    if (pw == nullptr) return std::string("cannot create the system user ") + kUser;
    uid_ = pw->pw_uid;
    gid_ = pw->pw_gid;
    return "";
  }

  std::string create_cluster() {
    if (access((bindir() + "/initdb").c_str(), X_OK) != 0) {
      return bindir() + "/initdb not found: install PostgreSQL 15 (Debian: apt-get install " +
             "postgresql) or set SLUICE_PG_BINDIR";
    }
    if (std::string error = ensure_user(); !error.empty()) return error;
    std::string pattern = (std::filesystem::temp_directory_path() / "sluice-pg-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return "mkdtemp failed";
    dir_ = pattern;
    if (geteuid() == 0 && chown(dir_.c_str(), uid_, gid_) != 0) return "chown failed";
    port_ = free_port();
    if (port_ == 0) return "no free TCP port on 127.0.0.1";
    const int status = run({bindir() + "/initdb", "-D", dir_ + "/data", "-U", "postgres",
                            "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"});
    if (status != 0) return "initdb failed with status " + std::to_string(status);
    return "";
  }

  // Forks a child that drops to the server user (under root), dies with this process, writes its
  // output to `log`, and execs `args`. Returns the child's pid (-1 if fork failed).
  pid_t spawn(std::vector<std::string> args, const std::string& log) const {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid != 0) return pid;
    if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(gid_) != 0 || setuid(uid_) != 0)) {
      _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGQUIT);  // after setuid, which clears it; SIGQUIT: immediate stop
    if (getppid() != parent) _exit(127);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    const int null_fd = open("/dev/null", O_RDONLY);
    dup2(null_fd, 0);
    dup2(out >= 0 ? out : null_fd, 1);
    dup2(out >= 0 ? out : null_fd, 2);
    close_range(3, ~0U, 0);
    execv(argv[0], argv.data());
    _exit(127);
  }

  int run(std::vector<std::string> args) const {
    const pid_t pid = spawn(std::move(args), dir_.empty() ? "/dev/null" : dir_ + "/setup.log");
    if (pid < 0) return -1;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string launch() {
    const std::string log = log_path();
    std::vector<std::string> args = {bindir() + "/postgres",
                                     "-D",
                                     dir_ + "/data",
                                     "-k",
                                     dir_,
                                     "-p",
                                     std::to_string(port_),
                                     "-c",
                                     "listen_addresses=127.0.0.1",
                                     "-c",
                                     "max_connections=200",
                                     "-c",
                                     "shared_buffers=64MB"};
    if (!durable_) {
      for (const char* s : {"fsync=off", "synchronous_commit=off", "full_page_writes=off"}) {
        args.insert(args.end(), {"-c", s});
      }
    }
    pid_ = spawn(args, log);
    if (pid_ < 0) {
      pid_ = 0;
      return "fork failed";
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return "postgres exited at startup; see " + log;
      }
      if (PQping(conninfo().c_str()) == PQPING_OK) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "postgres did not accept connections within 30 s; see " + log;
  }

  std::string log_path() const { return dir_ + "/postgres.log"; }
  std::uintmax_t log_size() const {
    std::error_code ignored;
    const std::uintmax_t size = std::filesystem::file_size(log_path(), ignored);
    return ignored ? 0 : size;
  }
  // Whether the server's log, after its first `from` bytes, says that its TCP port was taken.
  bool port_was_taken(std::uintmax_t from) const {
    std::ifstream log(log_path());
    log.seekg(static_cast<std::streamoff>(from));
    for (std::string line; std::getline(log, line);) {
      if (line.find("Address already in use") != std::string::npos) return true;
    }
    return false;
  }

  static constexpr const char* kUser = "sluice-test";
  bool durable_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = 0;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_POSTGRES_SERVER_HPP_
