#pragma once
// Flags agreed at start: every rank must run the same program with the same effective flags.
// mpirun can start ranks with different arguments (its MPMD syntax `-np 1 prog --x 3 : -np 1
// prog --x 5`, a wrapper script that varies them, a stale copy of the program on one node);
// such ranks would compute different batch counts, shapes or schedules and fail later in a
// collective with an MPI error that names nothing (Open MPI's MPI_ERR_TRUNCATE), or silently
// train something else.
//
// The fingerprint is generic (every option of Boost's variables_map, defaults included), so a new
// flag is covered with no code here. Paths are compared as given. The ranks exchange a hash of
// the text; only when the hashes differ are the texts gathered, to name the difference.

#include <ddp/communicator.h>

#include <boost/program_options/parsers.hpp>
#include <boost/program_options/variables_map.hpp>

#include <string>
#include <vector>

namespace ddp::cli {

// The fingerprint's text: "program=<program>" and then one "name=value" line per option of
// `vm`, sorted by name ("given" for an option without a value, such as --help). A value of a type
// the text cannot print is taken from `parsed` (the command line's tokens) when given there, else
// it is "(default)". Newlines in values are written as "\n".
std::string flags_fingerprint_text(const std::string& program,
                                   const boost::program_options::variables_map& vm,
                                   const boost::program_options::parsed_options& parsed);

// The text of a rank whose flags were refused: the program and `error` (the refusal's message),
// so that ranks refused alike agree, and a rank refused alone is named.
std::string flags_error_text(const std::string& program, const std::string& error);

// "" when every text is the same, else the message naming the first differing setting:
// "the ranks were started with different flags: --limit-train-batches is 3 on ranks 0,2 and 5
// on rank 1" (ranks as ranges: "ranks 0-3,5"), "--timeout is not given on rank 1",
// "the ranks run different programs: ...", "the ranks were started with different flags,
// refused on rank 1: --epochs must be >= 1 (got 0) (see --help)". `texts` holds one text per
// rank, in rank order.
std::string describe_flag_difference(const std::vector<std::string>& texts);

// Collective over `comm` (every rank of the job): compares the hashes of every rank's `text`,
// and gathers the texts only when they differ. Returns "" when all agree, else
// describe_flag_difference's message, on every rank.
std::string agree_on_flags(Communicator& comm, const std::string& text);

}  // namespace ddp::cli
