# Whole programs (tests/system, included by tests/CMakeLists.txt: paths are relative to tests/):
# jobs whose ranks fail, stall or misbehave around collectives, the examples built to raise a
# signal at a known step, and the examples run as a user runs them (flags, faults, resume).

# A failing or dying rank ends the whole job, naming the rank.
add_executable(abort_probe system/abort_probe.cpp)
ddp_use_internals(abort_probe)
ddp_add_mpi_failure_test(dead_rank_exception_ends_job
  "ddp: rank 2 \\(.*\\): deliberate failure in the probe" 3 $<TARGET_FILE:abort_probe> throw)
ddp_add_mpi_failure_test(dead_rank_exit_ends_job
  "Process name: \\[\\[[0-9]+,1\\],2\\]" 3 $<TARGET_FILE:abort_probe> exit)

# The MPI backend's watchdog and debug mode (tests/system/collective_faults.cpp, docs/reliability.md).
add_executable(collective_faults system/collective_faults.cpp)
ddp_use_internals(collective_faults)
ddp_add_mpi_test(collective_check_passes_when_ranks_agree 3 $<TARGET_FILE:collective_faults> agree)
set_tests_properties(collective_check_passes_when_ranks_agree PROPERTIES TIMEOUT 60
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_DEBUG=DETAIL"
  PASS_REGULAR_EXPRESSION "every rank called the same 7 collectives, results checked: OK")
ddp_add_mpi_failure_test(collective_mismatch_names_both_sides
  "DDP_DEBUG=DETAIL: the ranks call different collectives on one communicator: rank 0 called all_reduce #2 float32\\[10\\] \\(sum\\) but rank 1 called broadcast #2 int64\\[3\\] \\(root 0\\)"
  2 $<TARGET_FILE:collective_faults> mismatch)
# Issue 60: without DDP_DEBUG, a call whose dtype, op, root, shape or size differs on one rank
# ends the job in seconds naming both calls (before: a silent wrong result, or heap corruption
# for the 20000/40000 all-reduce). `case` and the two calls each names.
foreach(row
    "dtype|all_reduce #1 float32\\[10\\] \\(sum\\)|all_reduce #1 int32\\[10\\] \\(sum\\)"
    "op|all_reduce #1 float32\\[10\\] \\(sum\\)|all_reduce #1 float32\\[10\\] \\(max\\)"
    "root|broadcast #1 float32\\[10\\] \\(root 0\\)|broadcast #1 float32\\[10\\] \\(root 1\\)"
    "bigger_broadcast|broadcast #1 float32\\[10\\] \\(root 0\\)|broadcast #1 float32\\[20\\] \\(root 0\\)"
    "gather_dtype|all_gather #1 float32\\[10\\]|all_gather #1 int32\\[10\\]"
    "shape|all_reduce #1 float32\\[4,5\\] \\(sum\\)|all_reduce #1 float32\\[5,4\\] \\(sum\\)"
    "size|all_reduce #1 float32\\[20000\\] \\(sum\\)|all_reduce #1 float32\\[40000\\] \\(sum\\)")
  string(REPLACE "|" ";" row "${row}")
  list(GET row 0 case)
  list(GET row 1 rank0)
  list(GET row 2 rank1)
  ddp_add_mpi_failure_test(collective_mismatch_${case}_ends_job
    "ddp: rank [01] \\([^)]*\\): the ranks call different collectives on communicator 1 \\(ProcessGroup::cpu\\(\\)\\): rank 0 called ${rank0} but rank 1 called ${rank1}\\."
    2 $<TARGET_FILE:collective_faults> matrix ${case})
  set_tests_properties(collective_mismatch_${case}_ends_job PROPERTIES TIMEOUT 30)
endforeach()
# The 20000/40000 all-reduce again, with AddressSanitizer preloaded into both ranks (its heap
# redzones and its checks of libc's and the kernel's copies: Open MPI's shared-memory transfer
# wrote 64512 bytes past the smaller buffer before the agreement), on MPI and on the TCP ring.
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
  OUTPUT_VARIABLE DDP_LIBASAN OUTPUT_STRIP_TRAILING_WHITESPACE)
if(EXISTS "${DDP_LIBASAN}")
  foreach(sockets never always)
    ddp_add_mpi_failure_test(collective_mismatch_size_under_asan_${sockets}
      "ddp: rank [01] \\([^)]*\\): the ranks call different collectives on communicator 1 \\(ProcessGroup::cpu\\(\\)\\): rank 0 called all_reduce #1 float32\\[20000\\] \\(sum\\) but rank 1 called all_reduce #1 float32\\[40000\\] \\(sum\\)\\."
      2 -x LD_PRELOAD=${DDP_LIBASAN} -x ASAN_OPTIONS=detect_leaks=0 -x DDP_MPI_SOCKETS=${sockets}
      $<TARGET_FILE:collective_faults> matrix size)
    set_tests_properties(collective_mismatch_size_under_asan_${sockets} PROPERTIES TIMEOUT 60
      FAIL_REGULAR_EXPRESSION "AddressSanitizer")
  endforeach()
endif()
ddp_add_mpi_failure_test(mpi_watchdog_names_stopped_rank
  "MPI watchdog on rank [01]: all_reduce #3 float64\\[3\\] \\(max\\) on communicator 1( \\([^ ]+\\))? unfinished 2 s after rank [01] entered it .*Ranks that never arrived: rank 2 \\(no answer within 2 s.*waiting in it too: rank\\(s\\) [01]"
  3 $<TARGET_FILE:collective_faults> stop)
ddp_add_mpi_failure_test(mpi_watchdog_names_rank_stopped_in_socket_ring
  "MPI watchdog on rank [01]: all_reduce #3 float64\\[3\\] \\(max\\) on communicator 1( \\([^ ]+\\))? unfinished 2 s after rank [01] entered it .*Ranks that never arrived: rank 2 \\(no answer within 2 s.*waiting in it too: rank\\(s\\) [01]"
  3 $<TARGET_FILE:collective_faults> ring)
ddp_add_mpi_failure_test(mpi_watchdog_names_idle_rank
  "MPI watchdog on rank 0: all_reduce #3 float64\\[3\\] \\(max\\) on communicator 1( \\([^ ]+\\))? unfinished 2 s after rank 0 entered it .*Ranks that never arrived: rank 1 \\(no answer within 2 s"
  2 $<TARGET_FILE:collective_faults> idle)
ddp_add_mpi_failure_test(mpi_watchdog_ends_stuck_collective_after_stop_signal
  "MPI watchdog on rank 0: all_reduce #3 float64\\[3\\] \\(max\\) on communicator 1( \\([^ ]+\\))? unfinished 2 s after SIGTERM arrived while rank 0 was in it, so no rank can reach the step boundary where it would stop \\(MpiOptions::stop_grace\\). Ranks that never arrived: rank 1 \\(no answer within 2 s"
  2 $<TARGET_FILE:collective_faults> signal)
set_tests_properties(collective_mismatch_names_both_sides PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_DEBUG=DETAIL")
# Issue 38: DETAIL checks the communicators of one process group together. Rank 0 trains a
# DistributedDataParallel step while rank 1 all-reduces on group.cpu(): named at once, not hung;
# without DETAIL the watchdog fires and points to it; calls that agree across 4 communicators
# pass; a failing MPI call of a mismatch's error class points to it too.
ddp_add_mpi_failure_test(collective_mismatch_across_communicators_of_a_group_is_named
  "DDP_DEBUG=DETAIL: the ranks call collectives on different communicators of one process group .*: rank 0 called [a-z_]+ #[0-9]+ .* on communicator 3 \\(DistributedDataParallel's gradient communicator\\) but rank 1 called all_reduce #[0-9]+ float32\\[4\\] \\(sum\\) on communicator 1 \\(ProcessGroup::cpu\\(\\)\\)"
  2 $<TARGET_FILE:collective_faults> across)
# Without DETAIL the watchdog names what the other rank is in, on another communicator.
ddp_add_mpi_failure_test(mpi_watchdog_names_calls_across_communicators
  "MPI watchdog on rank [01]: [a-z_]+ #[0-9]+ .* on communicator [0-9] \\([^)]+\\)+ unfinished 2 s .*The ranks call different collectives: rank [01] is in [a-z_]+ #[0-9]+ [^ ]+ \\([a-z0-9 ]+\\) on communicator [0-9] \\((DistributedDataParallel's gradient communicator|ProcessGroup::cpu\\(\\))\\)\\. A collective called by some ranks only"
  2 $<TARGET_FILE:collective_faults> across)
# Rank 0 alone runs a forward through the wrapper in training mode (issue 40): the job ends
# naming both sides' calls and the likely cause, without DETAIL, long before the timeout (60 s):
# its buffer broadcast meets the other rank's bucket all-reduce in the ranks' agreement on the
# call (issue 60).
ddp_add_mpi_failure_test(collective_called_by_one_rank_is_named
  "the ranks call different collectives on communicator [0-9] \\(DistributedDataParallel's gradient communicator\\): rank 0 called broadcast #[0-9]+ int64\\[1\\] \\(root 0\\) but rank 1 called all_reduce #[0-9]+ float32\\[74\\] \\(sum\\)\\. A collective called by some ranks only, or by the ranks in another order, does this: e.g. a forward through DistributedDataParallel in training mode on some ranks only"
  2 $<TARGET_FILE:collective_faults> one_rank_forward)
set_tests_properties(collective_called_by_one_rank_is_named PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_TIMEOUT_SECONDS=60")
# The same mistake where the ranks then wait on different communicators (a GAN port sampling
# through its generator's wrapper on rank 0, the other rank on to its next step's all-reduce on
# group.cpu()): before issue 60 Open MPI truncated a message there (MPI_ERR_TRUNCATE); now no
# mismatched transfer starts, and the early check names both sides' calls and the likely cause.
ddp_add_mpi_failure_test(collective_truncated_by_one_rank_is_named
  "ddp: rank [01] \\([^)]*\\): rank [01]: [a-z_]+ #[0-9]+ [^ ]+( \\([a-z0-9 ]+\\))? on communicator [0-9] \\([^)]+\\)+ cannot finish: the ranks call different collectives, and none has moved on for [0-9]+ s: rank [01] is in [a-z_]+ #[0-9]+ [^ ]+( \\([a-z0-9 ]+\\))? on communicator [0-9] \\(.*\\. A collective called by some ranks only, or by the ranks in another order, does this"
  2 $<TARGET_FILE:collective_faults> one_rank_forward_then_step)
set_tests_properties(collective_truncated_by_one_rank_is_named PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_TIMEOUT_SECONDS=60")
# Any other MPI error on MPI_COMM_WORLD ends the job with ddp's line too (the same handler).
ddp_add_mpi_failure_test(mpi_world_error_is_a_ddp_line
  "ddp: rank 0 \\([^)]*\\): an MPI call on MPI_COMM_WORLD failed: MPI_ERR_RANK: invalid rank"
  2 $<TARGET_FILE:collective_faults> world_error)
ddp_add_mpi_test(collective_check_passes_across_communicators_of_a_group 3
  $<TARGET_FILE:collective_faults> interleave)
ddp_add_mpi_test(mpi_error_points_to_debug_detail 1 $<TARGET_FILE:collective_faults> mpi_error)
set_tests_properties(collective_mismatch_across_communicators_of_a_group_is_named PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_DEBUG=DETAIL")
set_tests_properties(mpi_watchdog_names_calls_across_communicators PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_TIMEOUT_SECONDS=2")
set_tests_properties(collective_check_passes_across_communicators_of_a_group PROPERTIES TIMEOUT 60
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_DEBUG=DETAIL"
  PASS_REGULAR_EXPRESSION "3 steps on 4 communicators of one group agreed, results checked: OK")
set_tests_properties(mpi_error_points_to_debug_detail PROPERTIES TIMEOUT 60
  PASS_REGULAR_EXPRESSION "MPI_ERR_TRUNCATE failed: .* \\(ranks that call different collectives, or the same with other sizes, cause this: DDP_DEBUG=DETAIL names the first call that differs\\)")
set_tests_properties(mpi_watchdog_names_stopped_rank mpi_watchdog_names_idle_rank
  mpi_watchdog_names_rank_stopped_in_socket_ring PROPERTIES
  ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_TIMEOUT_SECONDS=2")

# Test builds of the examples that raise a signal at a known optimizer step (the first argument,
# --signal-at-step=STEP:RANK:SIGNAL; tests/system/signal_at_step.cpp), for the tests of preemption and
# of ranks that stop or die.
foreach(example mnist cifar)
  if(TARGET ddp_${example})
    # The example with the testing hooks (util/testing_hooks.h) set from its environment.
    add_executable(ddp_${example}_signal_at_step system/signal_at_step.cpp system/testing_hooks_from_env.cpp)
    target_link_libraries(ddp_${example}_signal_at_step PRIVATE ${example}_example)
    ddp_use_internals(ddp_${example}_signal_at_step)
    target_include_directories(ddp_${example}_signal_at_step PRIVATE ${PROJECT_SOURCE_DIR}/examples)
    target_compile_definitions(ddp_${example}_signal_at_step PRIVATE
      DDP_SIGNAL_EXAMPLE=run_${example}_example)
    target_compile_options(ddp_${example}_signal_at_step PRIVATE -Wall -Wextra)
    # Its MPI_Init_thread wrapper (the "init" phase) must be what libddp's call finds.
    target_link_libraries(ddp_${example}_signal_at_step PRIVATE MPI::MPI_CXX)
    set_target_properties(ddp_${example}_signal_at_step PROPERTIES ENABLE_EXPORTS ON)
  endif()
endforeach()

if(TARGET ddp_mnist)
  # The demo trains for real, briefly, on 2 ranks and writes its metrics.
  ddp_add_mpi_test(ddp_mnist_2_ranks 2 $<TARGET_FILE:ddp_mnist> --epochs 1
    --limit-train-batches 20 --log-interval 10 --metrics-file ${DDP_TEST_TMP}/metrics.jsonl)
  set_tests_properties(ddp_mnist_2_ranks PROPERTIES
    PASS_REGULAR_EXPRESSION "Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000"
    FIXTURES_SETUP demo_metrics)
  # Step records and TensorBoard (issue 41): ddp_mnist at 2 ranks, fresh and resumed after a
  # crash; TensorBoard's own reader finds in the event files every step and epoch number of the
  # metrics file, and only those (system/tensorboard_check.sh). The run loads LibTorch and Debian's
  # protobuf in one process.
  if(TARGET ddp_mnist_signal_at_step)
    add_test(NAME ddp_mnist_tensorboard_equals_metrics_file
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/tensorboard_check.sh ${MPIEXEC_EXECUTABLE}
        $<TARGET_FILE:ddp_mnist> $<TARGET_FILE:ddp_mnist_signal_at_step> ${DDP_PYTHON}
        ${DDP_TEST_TMP}/tensorboard)
    set_tests_properties(ddp_mnist_tensorboard_equals_metrics_file PROPERTIES
      ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 600)
  endif()
  # The training-step flags together (issue 13): accumulation, clipping, bf16 autocast, warmup
  # into a per-step cosine schedule: it trains, the replicas stay identical (checked every 2
  # steps) and it evaluates.
  ddp_add_mpi_test(ddp_mnist_training_step_flags 2 $<TARGET_FILE:ddp_mnist> --epochs 1
    --limit-train-batches 12 --log-interval 0 --accumulate 3 --clip-grad-norm 1 --amp bf16
    --warmup-steps 2 --schedule cosine --check-sync-every 2)
  set_tests_properties(ddp_mnist_training_step_flags PROPERTIES TIMEOUT 120
    PASS_REGULAR_EXPRESSION "Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000")
  # The whole program under DDP_DEBUG=DETAIL (issue 38): the flag and stop agreements, the
  # DistributedDataParallel's communicators, the replica check and evaluation call the group's
  # communicators in one order on every rank, so the group's check finds no mismatch.
  ddp_add_mpi_test(ddp_mnist_debug_detail_finds_no_mismatch 2 $<TARGET_FILE:ddp_mnist> --epochs 1
    --limit-train-batches 6 --log-interval 0 --progress none --check-sync-every 2)
  set_tests_properties(ddp_mnist_debug_detail_finds_no_mismatch PROPERTIES TIMEOUT 120
    ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_DEBUG=DETAIL"
    PASS_REGULAR_EXPRESSION "Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000")
  # The hierarchical all-reduce at 4 ranks on 2 emulated hosts of 2 (DDP_TEST_HOST_SPLIT, read
  # by the test build's tests/system/testing_hooks_from_env.cpp): it trains with the replicas checked
  # identical after every step, and evaluates.
  ddp_add_mpi_test(ddp_mnist_hierarchical_2x2 4 $<TARGET_FILE:ddp_mnist_signal_at_step> --epochs 1
    --limit-train-batches 4 --log-interval 0 --hierarchical on --check-sync-every 1)
  set_tests_properties(ddp_mnist_hierarchical_2x2 PROPERTIES TIMEOUT 120
    ENVIRONMENT "${DDP_MPI_TEST_ENV};DDP_TEST_HOST_SPLIT=2,2"
    PASS_REGULAR_EXPRESSION "ddp: hierarchical all-reduce: 2 host\\(s\\), ranks per host 2,2: .*Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000")
  ddp_add_mpi_failure_test(ddp_mnist_bad_hierarchical
    "ddp_mnist: --hierarchical 'sometimes' is not one of: auto, on, off"
    2 $<TARGET_FILE:ddp_mnist> --hierarchical sometimes --dry-run)
  # Progress during an epoch: the live bar in a pseudo-terminal, log lines with ETA in a pipe.
  add_test(NAME progress_bar_and_log_lines COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/progress_check.sh
    ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_mnist>)
  set_tests_properties(progress_bar_and_log_lines PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}"
    TIMEOUT 300)
  # --help lists the flags grouped by topic, in this order.
  add_test(NAME ddp_mnist_help_groups COMMAND $<TARGET_FILE:ddp_mnist> --help)
  set_tests_properties(ddp_mnist_help_groups PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}"
    PASS_REGULAR_EXPRESSION
    "Model and optimizer:.*--gamma.*Training:.*--epochs.*Data:.*--data-dir.*Distributed:.*--backend.*Checkpoints:.*--resume.*Progress and diagnostics:.*--progress")
  # Issue 60: a fraction of a second was rounded up to a whole one, silently.
  ddp_add_mpi_failure_test(ddp_mnist_fractional_timeout
    "ddp_mnist: --timeout must be a whole number of seconds \\(got 0.3\\): the watchdogs count whole seconds \\(see --help\\)"
    2 $<TARGET_FILE:ddp_mnist> --timeout 0.3 --dry-run)
  ddp_add_mpi_failure_test(ddp_mnist_bad_progress
    "ddp_mnist: --progress: progress mode 'fancy': expected auto, bar, log or none \\(see --help\\)"
    2 $<TARGET_FILE:ddp_mnist> --progress fancy --dry-run)
  # Training curves from the demo's metrics file, and an error naming a bad one.
  add_test(NAME plot_metrics_from_demo COMMAND /usr/bin/python3
    ${PROJECT_SOURCE_DIR}/scripts/plot_metrics.py ${DDP_TEST_TMP}/curves.png
    "${DDP_TEST_TMP}/metrics.jsonl=2 ranks" ${DDP_TEST_TMP}/metrics.jsonl=again)
  set_tests_properties(plot_metrics_from_demo PROPERTIES FIXTURES_REQUIRED demo_metrics
    PASS_REGULAR_EXPRESSION "plot_metrics: wrote .*/curves.png \\(2 run\\(s\\)\\)")
  add_test(NAME plot_metrics_names_bad_file COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_failure.sh
    "plot_metrics: .*/abort_probe.cpp:1: not JSON" /usr/bin/python3
    ${PROJECT_SOURCE_DIR}/scripts/plot_metrics.py ${DDP_TEST_TMP}/bad.png
    ${CMAKE_CURRENT_SOURCE_DIR}/system/abort_probe.cpp)
  ddp_add_mpi_failure_test(ddp_mnist_bad_data_dir
    "ddp: rank [01] .*/no/such/dir/train-images-idx3-ubyte: no such file"
    2 $<TARGET_FILE:ddp_mnist> --data-dir /no/such/dir)
  ddp_add_mpi_failure_test(ddp_mnist_bad_flag
    "ddp_mnist: the argument \\('many'\\) for option '--epochs' is invalid"
    2 $<TARGET_FILE:ddp_mnist> --epochs many)
  ddp_add_mpi_failure_test(ddp_mnist_nccl_backend_on_cpu
    "ddp: rank [01] .*DDPOptions::backend is nccl, but the parameters are on cpu"
    2 $<TARGET_FILE:ddp_mnist> --backend nccl --no-cuda --dry-run)
  # A checkpoint directory that cannot be created (under a file: fails for root too) is
  # reported when the Trainer is built, before any training.
  ddp_add_mpi_failure_test(ddp_mnist_checkpoint_dir_not_creatable
    "ddp: rank 0 .*CheckpointerOptions::dir: .*/abort_probe.cpp/checkpoints: cannot create the checkpoint directory: Not a directory"
    2 $<TARGET_FILE:ddp_mnist> --dry-run --checkpoint-dir ${CMAKE_CURRENT_SOURCE_DIR}/system/abort_probe.cpp/checkpoints)
  # Issue 16's bad inputs: each fails fast, naming the flag or file, without an abort.
  if(TARGET ddp_cifar)
    add_test(NAME bad_input_is_refused COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/bad_input_check.sh
      ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_mnist> $<TARGET_FILE:ddp_cifar>
      $<TARGET_FILE:make_cifar_data> ${DDP_TEST_TMP}/bad_input)
    set_tests_properties(bad_input_is_refused PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}"
      TIMEOUT 240)
  endif()
  # Issue 26: one job per checkpoint directory (a second refused naming the first, a stale lock
  # taken over, the ranks of one job fine), with real jobs.
  add_test(NAME checkpoint_dir_one_job_at_a_time
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/checkpoint_lock_check.sh ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_mnist> ${DDP_TEST_TMP}/checkpoint_lock)
  set_tests_properties(checkpoint_dir_one_job_at_a_time PROPERTIES
    ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 240)
  # Issue 26: training that diverges exits 3 before writing anything non-finite, keeping the
  # good files (--keep-checkpoints); --on-nonfinite skip drops steps up to its limit.
  add_test(NAME ddp_mnist_divergence_stops_with_status_3
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/divergence_check.sh ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_mnist> ${DDP_PYTHON} ${DDP_TEST_TMP}/divergence)
  set_tests_properties(ddp_mnist_divergence_stops_with_status_3 PROPERTIES
    ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 240)
  # Issue 25: a snapshot inside an epoch resumes at another world size (4 -> 2 and 2 -> 4 ranks
  # with --keep-global-batch equal the run throughout within 1e-5; every sample of the epoch
  # trained once; a global batch that does not divide is refused with status 2).
  # ddp_add_resume_check(NAME SCRIPT TIMEOUT): a script that runs ddp_mnist and its
  # signal_at_step build under mpirun and compares the models, in a scratch folder of its own.
  function(ddp_add_resume_check name script timeout)
    add_test(NAME ${name} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/${script} ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_mnist> $<TARGET_FILE:ddp_mnist_signal_at_step>
      $<TARGET_FILE:ddp_compare_models> ${DDP_TEST_TMP}/${name})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT ${timeout})
  endfunction()
  if(TARGET ddp_compare_models)
    ddp_add_resume_check(resume_at_another_world_size system/resize_resume_check.sh 600)
    # Issue 38: PowerSGD's state in the snapshot (SIGTERM, 75, resume bit-identical), and a
    # resume with other settings names each one.
    ddp_add_resume_check(resume_exact_and_changed_settings_said system/resume_exact_check.sh 300)
  endif()
  # Issue 60: the lines of a resume say only what is true (system/resume_lines_check.sh lists
  # them), with real jobs at 1, 2 and 3 ranks.
  add_test(NAME resume_lines_say_what_happens
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/resume_lines_check.sh ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_mnist> $<TARGET_FILE:ddp_mnist_signal_at_step>
      ${DDP_TEST_TMP}/resume_lines)
  set_tests_properties(resume_lines_say_what_happens PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}"
    TIMEOUT 300)
  # A rank stopped (SIGSTOP) or killed (SIGKILL, a rank and step from a printed seed) in the
  # middle of training ends the job within 30 s, naming it (tests/system/rank_faults_check.sh).
  foreach(fault stop:ddp_mnist_stopped_rank_ends_job_within_timeout
                kill:ddp_mnist_killed_rank_ends_job_naming_it)
    string(REPLACE ":" ";" fault ${fault})
    list(GET fault 0 case)
    list(GET fault 1 name)
    add_test(NAME ${name} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/rank_faults_check.sh ${case}
      ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_mnist_signal_at_step> ${DDP_TEST_TMP}/rank_faults_${case})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 120)
  endforeach()
  # Snapshots every S seconds (issue 25): agreed over the ranks when one rank's timer is due,
  # counted in the summary, and resumed from bit-identically (tests/system/snapshot_cost_check.sh).
  if(TARGET ddp_compare_models)
    ddp_add_resume_check(ddp_mnist_timed_snapshots_agree_and_resume system/snapshot_cost_check.sh 240)
  endif()
  # A rank that stalls outside any collective (in MPI_Init, loading data) ends the job by the
  # phase watchdog's timeout, naming the phase (tests/system/startup_stall_check.sh); so does one
  # stopped before MPI_Finalize, which waits for every rank.
  # --timeout bounds start-up too (issue 38): mpi-init-timeout.
  foreach(stall mpi-init mpi-init-timeout loading-data shutdown)
    add_test(NAME ddp_mnist_rank_stalled_in_${stall}_ends_job COMMAND
      ${CMAKE_CURRENT_SOURCE_DIR}/system/startup_stall_check.sh ${stall} ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_mnist_signal_at_step> ${DDP_TEST_TMP}/startup_stall_${stall})
    set_tests_properties(ddp_mnist_rank_stalled_in_${stall}_ends_job PROPERTIES
      ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 120)
  endforeach()
  ddp_add_mpi_failure_test(mnist_refuses_several_ranks
    "use ddp_mnist for data-parallel training" 2 $<TARGET_FILE:mnist> --dry-run)
endif()

if(TARGET ddp_cifar)
  # CIFAR-10 demos on the synthetic CIFAR-format data set (tests/system/make_cifar_data.cpp).
  set(DDP_CIFAR_DATA ${DDP_TEST_TMP}/cifar_synthetic)
  ddp_add_mpi_test(ddp_cifar_2_ranks 2 $<TARGET_FILE:ddp_cifar> --data-dir ${DDP_CIFAR_DATA}
    --model cnn --epochs 1 --batch-size 32 --log-interval 10 --check-sync-every 8)
  set_tests_properties(ddp_cifar_2_ranks PROPERTIES FIXTURES_REQUIRED cifar_synthetic
    PASS_REGULAR_EXPRESSION "Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/512")
  # Without the buffer broadcast, BatchNorm statistics drift apart and the check names them.
  ddp_add_mpi_failure_test(ddp_cifar_check_sync_catches_drift
    "replicas differ at step 2 .*buffer 'features.0.bn.running_mean'.* rank\\(s\\) 1"
    2 $<TARGET_FILE:ddp_cifar> --data-dir ${DDP_CIFAR_DATA} --model cnn --epochs 1
    --batch-size 16 --limit-train-batches 4 --no-broadcast-buffers --check-sync-every 2)
  # SyncBatchNorm computes the same statistics on every rank: no broadcast needed.
  ddp_add_mpi_test(ddp_cifar_sync_batchnorm_stays_in_sync 2 $<TARGET_FILE:ddp_cifar>
    --data-dir ${DDP_CIFAR_DATA} --model cnn --epochs 1 --batch-size 16 --limit-train-batches 4
    --no-broadcast-buffers --sync-batchnorm --check-sync-every 1 --log-interval 0)
  set_tests_properties(ddp_cifar_check_sync_catches_drift ddp_cifar_sync_batchnorm_stays_in_sync
    PROPERTIES FIXTURES_REQUIRED cifar_synthetic)
  ddp_add_mpi_failure_test(ddp_cifar_bad_data_dir
    "ddp: rank [01] .*/no/such/dir/data_batch_1.bin" 2 $<TARGET_FILE:ddp_cifar> --data-dir /no/such/dir)
  add_test(NAME ddp_cifar_resume_is_bit_identical
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/cifar_resume_check.sh ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_cifar> $<TARGET_FILE:ddp_compare_models> ${DDP_CIFAR_DATA}
      ${DDP_TEST_TMP}/cifar_resume)
  set_tests_properties(ddp_cifar_resume_is_bit_identical PROPERTIES FIXTURES_REQUIRED cifar_synthetic
    ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 300)
  # Faults of the checkpoint directory (tests/system/checkpoint_faults.sh), from epoch 1's files: a full
  # disk and a read-only directory (a tmpfs mounted in a private mount namespace: root only, else
  # skipped), and a kill -9 in the middle of a snapshot write (held there by system/stall_write.cpp).
  add_library(stall_write MODULE system/stall_write.cpp)
  target_link_libraries(stall_write PRIVATE ${CMAKE_DL_LIBS})
  foreach(fault setup:checkpoint_faults_setup
                full-disk:checkpoint_full_disk_says_no_space_left
                metrics-full-disk:metrics_full_disk_says_no_space_left
                read-only:checkpoint_dir_read_only_refused_at_start
                kill-mid-write:checkpoint_kill_during_snapshot_write)
    string(REPLACE ":" ";" fault ${fault})
    list(GET fault 0 case)
    list(GET fault 1 name)
    add_test(NAME ${name} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/checkpoint_faults.sh ${case}
      ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_cifar> $<TARGET_FILE:make_cifar_data>
      $<TARGET_FILE:stall_write> ${DDP_TEST_TMP}/checkpoint_faults)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 120
      SKIP_RETURN_CODE 77)
    if(case STREQUAL "setup")
      set_tests_properties(${name} PROPERTIES FIXTURES_SETUP checkpoint_epoch1)
    else()
      set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED checkpoint_epoch1)
    endif()
  endforeach()
  # A stop signal mid-epoch (on one rank; to mpirun), a crash after a periodic snapshot: each
  # resumed run ends bit-identical to the uninterrupted one (docs/reliability.md).
  add_test(NAME ddp_cifar_preempt_resume_is_bit_identical
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/preempt_resume_check.sh ${MPIEXEC_EXECUTABLE}
      $<TARGET_FILE:ddp_cifar> $<TARGET_FILE:ddp_cifar_signal_at_step>
      $<TARGET_FILE:ddp_compare_models> ${DDP_CIFAR_DATA}
      ${DDP_TEST_TMP}/cifar_preempt)
  set_tests_properties(ddp_cifar_preempt_resume_is_bit_identical PROPERTIES
    FIXTURES_REQUIRED cifar_synthetic ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 300)
  # Issue 26's chaos run: 20 faults drawn from seed 26 (kill -9, SIGSTOP, SIGTERM, SIGUSR1, a
  # stalled snapshot write, at any moment of a job's life): each job ends in its bound with the
  # documented status and message, and its resume is bit-identical (scripts/chaos_sweep.sh: more
  # seeds).
  if(TARGET ddp_mnist AND TARGET ddp_compare_models)
    add_test(NAME chaos_run_20_faults
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/chaos_check.sh 26 20 ${MPIEXEC_EXECUTABLE}
        $<TARGET_FILE:ddp_mnist> $<TARGET_FILE:ddp_compare_models> $<TARGET_FILE:stall_write>
        ${DDP_TEST_TMP}/chaos)
    set_tests_properties(chaos_run_20_faults PROPERTIES ENVIRONMENT "${DDP_MPI_TEST_ENV}"
      TIMEOUT 1200 LABELS chaos)
  endif()
  # A stop signal at start-up (inside MPI_Init; before the Trainer) and repeated during and after
  # the stop's snapshot write: status 75 and a bit-identical resume (tests/system/stop_exit_check.sh).
  foreach(stop start-init:stop_signal_in_mpi_init_exits_75
               start-setup:stop_signal_before_trainer_exits_75
               second-term:second_sigterm_during_snapshot_exits_75)
    string(REPLACE ":" ";" stop ${stop})
    list(GET stop 0 case)
    list(GET stop 1 name)
    add_test(NAME ${name} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/system/stop_exit_check.sh ${case}
      ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_cifar> $<TARGET_FILE:ddp_cifar_signal_at_step>
      $<TARGET_FILE:ddp_compare_models> $<TARGET_FILE:stall_write> ${DDP_CIFAR_DATA}
      ${DDP_TEST_TMP}/stop_exit)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED cifar_synthetic
      ENVIRONMENT "${DDP_MPI_TEST_ENV}" TIMEOUT 180)
  endforeach()
endif()
