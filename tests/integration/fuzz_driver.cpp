// The in-process half of tests/integration/fuzz_inputs.py: runs each input
// of a corpus list through the library function its verb calls (the thin
// tools call the same ones), one forked child per input under a time limit,
// and reports crashes (a signal), hangs (the limit) and LibTorch traces
// ("frame #") in any message. LibTorch-free, so one input costs a fork, not
// a process start that loads LibTorch: a thousand inputs take seconds.
//
//   fuzz_driver LIST MODEL SECONDS      (LIST: one "KIND PATH" a line)
// KIND: onnx (plan it), plan (check, show, simulate), cluster (plan MODEL on
// it), npy (open, read every sample), checkpoint (export it into MODEL).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "executor/checkpoint/onnx_export.h"
#include "executor/data/npy.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"

namespace {

using namespace rannc;

/// What one input's verbs said: every message, for the "frame #" check.
Status runOne(const std::string &kind, const std::string &path, const std::string &model, std::ostream &msgs) {
  std::ostringstream out;
  const std::string scratch = path + ".fuzz-out";
  auto plan = [&](const std::string &m, const std::string &cluster) {
    planner::PlanOptions o;
    o.model = m;
    o.cluster_file = cluster;
    o.gpus = 2;
    o.batch_size = 8;
    o.profile = "analytic";
    o.output = scratch + ".json";
    Status st = planner::runPlan(o, out, msgs);
    std::remove(o.output.c_str());
    return st;
  };
  Status st;
  if (kind == "onnx") {
    st = plan(path, "");
  } else if (kind == "cluster") {
    st = plan(model, path);
  } else if (kind == "plan") {
    planner::CheckOptions c;
    c.plan = path;
    st = planner::runCheck(c, out, msgs);
    if (Status show = planner::runShow(path, false, out); !show) msgs << show.message() << "\n";
    planner::SimulateCommandOptions sim;
    sim.plan = path;
    if (Status s = planner::runSimulate(sim, out, msgs); !s) msgs << s.message() << "\n";
  } else if (kind == "npy") {
    auto a = data::NpyArray::open(path);
    if (!a) return a.error();
    std::string buf(size_t(a->sampleBytes()), '\0');
    for (int64_t i = 0; i < a->samples() && i < 4096; ++i)
      if (st = a->readSample(i, buf.data()); !st) break;
  } else if (kind == "checkpoint") {
    st = checkpoint::exportCheckpoint({path, model, scratch + ".onnx"}, msgs);
    std::remove((scratch + ".onnx").c_str());
  } else {
    st = Error{"unknown kind " + kind};
  }
  msgs << out.str();
  return st;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 4) {
    std::cerr << "usage: fuzz_driver LIST MODEL SECONDS\n";
    return 2;
  }
  const std::string model = argv[2];
  const unsigned limit = unsigned(std::stoi(argv[3]));
  std::ifstream list(argv[1]);
  int inputs = 0, crashes = 0, hangs = 0, traces = 0, refused = 0;
  std::string kind, path;
  while (list >> kind >> path) {
    ++inputs;
    int fds[2];
    if (::pipe(fds) != 0) return 2;
    std::cout.flush();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(limit); // a hang ends in SIGALRM, reported as such
      std::ostringstream msgs;
      Status st;
      try {
        st = runOne(kind, path, model, msgs);
      } catch (const std::exception &e) {
        st = Error{std::string("uncaught exception: ") + e.what()};
      }
      const std::string text = (st ? "OK " : "ERR ") + st.message() + "\n" + msgs.str();
      for (size_t done = 0; done < text.size();) {
        ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
        if (n <= 0) break;
        done += size_t(n);
      }
      ::_exit(st ? 0 : 1);
    }
    ::close(fds[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string first = text.substr(0, text.find('\n'));
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      ++hangs;
      std::cout << "HANG " << kind << " " << path << "\n";
    } else if (WIFSIGNALED(status)) {
      ++crashes;
      std::cout << "CRASH (signal " << WTERMSIG(status) << ") " << kind << " " << path << "\n";
    } else if (text.find("frame #") != std::string::npos || text.find("uncaught exception") != std::string::npos) {
      ++traces;
      std::cout << "TRACE " << kind << " " << path << ": " << first << "\n";
    } else if (WEXITSTATUS(status) != 0) {
      ++refused;
    }
  }
  std::cout << "fuzz_driver: " << inputs << " inputs, " << refused << " refused with an error, " << crashes
            << " crashes, " << hangs << " hangs, " << traces << " stack traces or uncaught exceptions\n";
  return crashes + hangs + traces == 0 ? 0 : 1;
}
