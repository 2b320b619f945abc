// Runs this test binary again as a child process, restricted to one test and
// with extra environment variables: a real second process for re-attach and
// crash tests.
#ifndef KVNODE_TESTS_STORAGE_CHILD_PROCESS_H_
#define KVNODE_TESTS_STORAGE_CHILD_PROCESS_H_

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace kvnode::storage::testing {

// Starts /proc/self/exe --gtest_filter=<test> with `env` added. Returns the pid
// or -1.
inline pid_t SpawnTest(const std::string& test, const std::map<std::string, std::string>& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=" + test;
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

// Waits for the child; returns its exit status, or 128+signal.
inline int WaitChild(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

inline const char* Env(const char* name) { return getenv(name); }

}  // namespace kvnode::storage::testing

#endif  // KVNODE_TESTS_STORAGE_CHILD_PROCESS_H_
