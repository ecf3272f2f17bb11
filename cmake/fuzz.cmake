# libFuzzer targets for the parsers of untrusted input (tests/fuzz/fuzz_<name>.cpp), built with
# clang and AddressSanitizer + UBSan when MYRIAD_FUZZ=ON. scripts/fuzz.sh configures build/fuzz,
# builds them and runs each on its seed corpus in tests/fuzz/corpus/<name>/.
# They link an instrumented copy of only the code they reach (core, io, model config), so the
# fuzz build never compiles the kernels.
option(MYRIAD_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
if(MYRIAD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MYRIAD_FUZZ=ON needs clang: configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  set(MYRIAD_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g)
  file(GLOB MYRIAD_FUZZ_SOURCES CONFIGURE_DEPENDS
    src/core/*.cpp src/io/*.cpp src/model/config.cpp src/serve/protocol.cpp src/serve/jinja.cpp
    src/vision/image.cpp)
  add_library(myriad_fuzz_lib OBJECT ${MYRIAD_FUZZ_SOURCES})
  target_include_directories(myriad_fuzz_lib PUBLIC src)
  target_compile_options(myriad_fuzz_lib PRIVATE ${MYRIAD_WARNINGS} ${MYRIAD_FUZZ_SAN}
    -fsanitize=fuzzer-no-link)
  target_link_libraries(myriad_fuzz_lib PUBLIC nlohmann_json::nlohmann_json)
  file(GLOB MYRIAD_FUZZ_TARGETS CONFIGURE_DEPENDS tests/fuzz/fuzz_*.cpp)
  foreach(src ${MYRIAD_FUZZ_TARGETS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_compile_options(${name} PRIVATE ${MYRIAD_WARNINGS} ${MYRIAD_FUZZ_SAN} -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE ${MYRIAD_FUZZ_SAN} -fsanitize=fuzzer)
    target_link_libraries(${name} PRIVATE myriad_fuzz_lib)
  endforeach()
endif()
