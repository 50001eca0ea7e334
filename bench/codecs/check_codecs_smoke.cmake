# ctest bench_codecs_smoke: run a tiny `terse-bench codecs` and check that
# every default codec produced an "ok" row with a finite, positive ratio.
#   cmake -DBENCH=path/to/terse-bench -P check_codecs_smoke.cmake
# The list below is the bench's default list (bench/codecs/codecs.c): keep them equal.
cmake_minimum_required(VERSION 3.18)
set(expected none fp16 bf16 int8 qsgd:bits=4 qsgd:bits=8 terngrad sign
    topk:ratio=0.01 topk:ratio=0.001 randk:ratio=0.01 powersgd:rank=4 vq)

if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to terse-bench>")
endif()
execute_process(COMMAND ${BENCH} codecs --quick -s 64K -r 1 --csv -q
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "terse-bench exited with ${rc}\n${err}\n${out}")
endif()

# The columns checked come before any field that may hold a comma, so a
# plain split of each line's prefix is enough.
# Semicolons and brackets would upset CMake's list splitting.
string(REPLACE ";" "," out "${out}")
string(REPLACE "[" "(" out "${out}")
string(REPLACE "]" ")" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
list(GET lines 0 header)
if(NOT header MATCHES "^size,n,rows,cols,spec,status,bytes,ratio,")
  message(FATAL_ERROR "unexpected CSV header: ${header}")
endif()
set(field "([^,]*)")
set(number "^[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$")
set(problems "")
foreach(spec IN LISTS expected)
  set(found 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "^${field},${field},${field},${field},${field},${field},${field},${field},")
      if(CMAKE_MATCH_5 STREQUAL spec AND CMAKE_MATCH_1 STREQUAL "64K")
        set(found 1)
        set(status "${CMAKE_MATCH_6}")
        set(ratio "${CMAKE_MATCH_8}")
        if(NOT status STREQUAL "ok")
          if(line MATCHES ",\"(.*)\"$" OR line MATCHES ",([^,]*)$")
            set(why "${CMAKE_MATCH_1}")
          endif()
          list(APPEND problems "${spec}: ${status}: ${why}")
        elseif(NOT ratio MATCHES "${number}" OR ratio MATCHES "^[0.]+$")
          list(APPEND problems "${spec}: ratio '${ratio}' is not a finite positive number")
        endif()
      endif()
    endif()
  endforeach()
  if(NOT found)
    list(APPEND problems "${spec}: no row")
  endif()
endforeach()
if(problems)
  list(LENGTH problems n)
  list(JOIN problems "\n  " text)
  # Plain message(): FATAL_ERROR would re-wrap the lines.
  message("CSV output:\n${out}\ncodecs without a finite ratio:\n  ${text}")
  message(FATAL_ERROR "bench_codecs_smoke: ${n} default codec(s) without a finite ratio")
endif()
list(LENGTH expected n)
message(STATUS "bench_codecs_smoke: all ${n} default codecs gave a finite ratio")
