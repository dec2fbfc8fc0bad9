// Usage errors and exit codes shared by rannc-plan and rannc-exec: one exit
// code per class of error, one line per error, "did you mean" for a mistyped
// flag or verb, and under a launcher only rank 0 speaks.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace rannc::cli {

// Note [exit codes]
// Each tool exits with one code per class of error, the same in both tools:
//   0  success (also --help and --version);
//   1  the run failed: something it read (a model, plan, data, checkpoint,
//      cluster file) or did (a step, a write) went wrong; the message names
//      the file, field or rank;
//   2  usage: the command line itself (an unknown flag or verb, a missing or
//      extra argument, a value out of range or not one of the choices).
// CLI11's own codes (105, 106, 109, ...) are never returned: they told a user
// nothing the message did not, and differed from the tools' other errors.
enum ExitCode : int { kOk = 0, kFailed = 1, kUsage = 2 };

/// The footer both tools' --help ends with (Note [exit codes]).
inline const char *exitCodesHelp() {
  return "Exit status: 0 success; 1 the run failed (a model, plan, data or checkpoint it read, or a step; the "
         "message names it); 2 a usage error (the command line). docs/robustness.md";
}

/// This process's rank from its launcher (mpirun, srun, Hydra), 0 without
/// one: before MPI starts, usage errors are printed by rank 0 alone.
inline int launcherRank() {
  for (const char *name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char *v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return 0;
}

/// Levenshtein distance of `a` and `b`.
inline size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// The word of `choices` nearest to `word`, or "" when none is near enough
/// to be a typo of it: 2 edits (a swap of two letters), 1 for words of up to
/// 3 letters (leading dashes not counted).
inline std::string nearest(const std::string &word, const std::vector<std::string> &choices) {
  const size_t letters = word.size() - std::min(word.find_first_not_of('-'), word.size());
  std::string best;
  size_t best_d = (letters <= 3 ? 1 : 2) + 1;
  for (const std::string &c : choices) {
    const size_t d = editDistance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

/// "; did you mean ..." for each flag on the command line that `app` (and
/// the verb given, if any) does not declare, and for a first word that is
/// near one of `verbs` but is no file.
inline std::string suggestions(const CLI::App &app, int argc, char **argv, const std::vector<std::string> &verbs) {
  std::vector<const CLI::App *> scopes = {&app};
  for (const CLI::App *sub : app.get_subcommands([](const CLI::App *) { return true; }))
    if (argc > 1 && sub->get_name() == argv[1]) scopes.push_back(sub);
  std::vector<std::string> flags;
  for (const CLI::App *scope : scopes)
    for (const CLI::Option *o : scope->get_options())
      for (const std::string &l : o->get_lnames()) flags.push_back("--" + l);
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") continue;
    const std::string flag = arg.substr(0, arg.find('='));
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) continue;
    if (std::string near = nearest(flag, flags); !near.empty())
      out += "; did you mean " + near + " (for " + flag + ")?";
  }
  if (argc > 1 && argv[1][0] != '-' && std::find(verbs.begin(), verbs.end(), argv[1]) == verbs.end()) {
    std::error_code ec;
    if (!std::filesystem::exists(argv[1], ec))
      if (std::string near = nearest(argv[1], verbs); !near.empty())
        out += "; did you mean the verb '" + near + "' (for '" + std::string(argv[1]) + "')?";
  }
  return out;
}

/// Reports a CLI11 parse error (Note [exit codes]): help and --version as
/// CLI11 does (exit 0); anything else as one line on rank 0, exit 2.
inline int usageError(CLI::App &app, const CLI::ParseError &e, int argc, char **argv,
                      const std::vector<std::string> &verbs = {}) {
  if (e.get_exit_code() == int(CLI::ExitCodes::Success)) return app.exit(e);
  if (launcherRank() == 0)
    std::cerr << app.get_name() << ": error: " << e.what() << suggestions(app, argc, argv, verbs) << " ("
              << app.get_name() << " --help lists the flags)\n";
  return kUsage;
}

/// A flag's value the tool refused after parsing: as usageError.
inline int usageError(CLI::App &app, const std::string &message) {
  if (launcherRank() == 0) std::cerr << app.get_name() << ": error: " << message << "\n";
  return kUsage;
}

} // namespace rannc::cli
