// The ranks' flag agreement (src/cli/flag_agreement.h): the fingerprint covers every option
// generically, and the message names the first differing setting and which ranks hold which
// value. tests/system/bad_input_check.sh starts real ranks with different flags (mpirun's MPMD
// syntax).
#include "cli/flag_agreement.h"

#include <ddp/cli/training_flags.h>

#include <boost/program_options.hpp>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

namespace po = boost::program_options;
using ddp::cli::describe_flag_difference;
using ddp::cli::flags_error_text;
using ddp::cli::flags_fingerprint_text;

// The fingerprint of `args` (without the program name) under the training flags and one option
// of a type the fingerprint has no printer for (char).
std::string fingerprint(std::vector<std::string> args, const std::string& program = "ddp_mnist") {
  ddp::cli::TrainingFlags flags;
  po::options_description options("test");
  ddp::cli::add_training_flags(options, flags, {64, 14, 1.0, "data", "data", "m.pt"});
  char letter = 'a';
  options.add_options()("letter", po::value(&letter)->default_value('a'), "a char");
  std::vector<const char*> argv{program.c_str()};
  for (const auto& arg : args) argv.push_back(arg.c_str());
  const po::parsed_options parsed =
      po::parse_command_line(static_cast<int>(argv.size()), argv.data(), options);
  po::variables_map vm;
  po::store(parsed, vm);
  po::notify(vm);
  return flags_fingerprint_text(program, vm, parsed);
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(FlagAgreement, TheFingerprintHasEveryOptionDefaultsIncluded) {
  const std::string text = fingerprint({"--limit-train-batches", "3", "--lr", "0.1", "--no-cuda",
                                        "--timeout", "30", "--letter", "z"});
  EXPECT_EQ(text.rfind("program=ddp_mnist\n", 0), 0u) << text;
  EXPECT_TRUE(has_line(text, "limit-train-batches=3")) << text;
  EXPECT_TRUE(has_line(text, "lr=0.1")) << text;
  EXPECT_TRUE(has_line(text, "no-cuda=true")) << text;
  EXPECT_TRUE(has_line(text, "timeout=30")) << text;
  EXPECT_TRUE(has_line(text, "letter=--letter z")) << text;  // no printer: the tokens given
  EXPECT_TRUE(has_line(text, "batch-size=64")) << text;      // a default
  EXPECT_TRUE(has_line(text, "dry-run=false")) << text;
  EXPECT_TRUE(has_line(text, "data-dir=data")) << text;
  EXPECT_TRUE(has_line(fingerprint({}), "letter=(default)"));
  EXPECT_FALSE(has_line(fingerprint({}), "timeout=30"));  // no default: absent
  EXPECT_TRUE(has_line(fingerprint({"--help"}), "help=given"));
  // Another spelling of the same value is the same setting; close values are not.
  EXPECT_EQ(fingerprint({"--lr", "0.10"}), fingerprint({"--lr", "0.1"}));
  EXPECT_NE(fingerprint({"--lr", "0.1"}), fingerprint({"--lr", "0.10000000000000002"}));
  EXPECT_TRUE(has_line(fingerprint({"--lr", "0.10000000000000002"}), "lr=0.10000000000000002"));
}

TEST(FlagAgreement, TheSameFlagsAgree) {
  const std::string a = fingerprint({"--epochs", "2"});
  EXPECT_EQ(describe_flag_difference({a, a, a}), "");
  EXPECT_EQ(describe_flag_difference({a}), "");
}

TEST(FlagAgreement, TheFirstDifferingSettingIsNamedWithItsRanks) {
  const std::string three = fingerprint({"--limit-train-batches", "3"});
  const std::string five = fingerprint({"--limit-train-batches", "5"});
  EXPECT_EQ(describe_flag_difference({three, five, three}),
            "the ranks were started with different flags: --limit-train-batches is 3 on ranks "
            "0,2 and 5 on rank 1");
  // The first in name order: --epochs before --limit-train-batches.
  const std::string other = fingerprint({"--limit-train-batches", "5", "--epochs", "9"});
  EXPECT_EQ(
      describe_flag_difference({three, other}),
      "the ranks were started with different flags: --epochs is 14 on rank 0 and 9 on rank 1");
  // Ranges of ranks, three values.
  const std::string seven = fingerprint({"--limit-train-batches", "7"});
  EXPECT_EQ(describe_flag_difference({three, three, three, five, three, seven}),
            "the ranks were started with different flags: --limit-train-batches is 3 on ranks "
            "0-2,4, 5 on rank 3 and 7 on rank 5");
}

TEST(FlagAgreement, AFlagGivenOnSomeRanksOnly) {
  EXPECT_EQ(describe_flag_difference({fingerprint({"--timeout", "30"}), fingerprint({})}),
            "the ranks were started with different flags: --timeout is 30 on rank 0 and not "
            "given on rank 1");
  EXPECT_EQ(describe_flag_difference({fingerprint({}), fingerprint({"--metrics-file", "m.json"})}),
            "the ranks were started with different flags: --metrics-file is \"\" on rank 0 and "
            "m.json on rank 1");
}

TEST(FlagAgreement, DifferentProgramsAreNamedFirst) {
  EXPECT_EQ(describe_flag_difference(
                {fingerprint({"--epochs", "3"}, "ddp_mnist"), fingerprint({}, "ddp_cifar")}),
            "the ranks run different programs: ddp_mnist on rank 0 and ddp_cifar on rank 1");
}

TEST(FlagAgreement, ABadFlagOnSomeRanksNamesThem) {
  const std::string good = fingerprint({});
  const std::string bad =
      flags_error_text("ddp_mnist", "--epochs must be >= 1 (got 0) (see --help)");
  EXPECT_EQ(describe_flag_difference({good, bad, bad}),
            "the ranks were started with different flags, refused on ranks 1,2: --epochs must be "
            ">= 1 (got 0) (see --help)");
  EXPECT_EQ(describe_flag_difference({bad, bad}), "");  // refused alike: the usual message
}

}  // namespace
