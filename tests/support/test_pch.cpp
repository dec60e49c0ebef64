// The source of ddp_test_pch (tests/CMakeLists.txt), the target that makes the test programs'
// precompiled header. It compiles nothing of its own.
