#pragma once
/// \file
/// Training progress on rank 0: a live bar on a terminal, log lines elsewhere.
///
/// The bar is one line redrawn in place, like tqdm: the epoch's batch i/N, the percentage, a bar,
/// samples/s over all ranks, the latest loss (averaged over ranks at each log interval), the time
/// spent and the time left (ETA). Where the output is not a terminal (a Slurm log, a file, CI),
/// a log line at the log interval, with the ETA (the report format's: reporter.h).

#include <cstdint>
#include <string>

namespace ddp {

/// What rank 0 prints during an epoch (--progress).
enum class ProgressMode {
  Auto,  ///< Bar when rank 0's output is a terminal, else Log
  Bar,   ///< the live bar, redrawn at most 10 times a second
  Log,   ///< a line per log interval, with the ETA
  None,  ///< nothing during the epoch (the epoch summary still prints)
};

/// "auto", "bar", "log" or "none"; anything else throws std::invalid_argument naming the value.
ProgressMode parse_progress_mode(const std::string& value);

/// Does this process's standard output reach a terminal? Under Open MPI's mpirun every rank's
/// stdout is a pseudo-terminal even when mpirun's own output goes to a file, so for a rank
/// started by mpirun (its parent) the answer is mpirun's: is mpirun's stdout a terminal?
bool output_is_terminal();

/// Auto resolved for this process; the other modes as they are.
ProgressMode resolve_progress_mode(ProgressMode mode);

/// Columns of the terminal on standard output (its window size, else $COLUMNS, else 100).
int terminal_width();

/// "0:07", "12:34", "1:02:03" (hours only when needed); negative or unknown: "?".
std::string format_duration(double seconds);

/// Seconds left when `done` of `total` units took `elapsed` seconds; negative when unknown.
double eta_seconds(double elapsed, int64_t done, int64_t total);

/// One bar line, at most `width` characters (the bar shrinks to fit), e.g.
///   Epoch 1 [120/469  26%] |#######.......................| 1169 samples/s loss 0.5234 0:12<0:35
/// `loss` < 0: not known yet (shown as "-").
std::string format_progress_bar(int64_t epoch, int64_t done, int64_t total, double samples_per_sec,
                                double loss, double elapsed, int width);

}  // namespace ddp
