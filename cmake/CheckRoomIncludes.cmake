# Fails when a source of one of the daemon's rooms includes a header of a room
# it may not depend on (server/CMakeLists.txt draws the graph). Run as a step of
# each room's build:
#   cmake -DROOM=model -DALLOWED="base;policy;model" -DDIR=server/model -P CheckRoomIncludes.cmake
# A header straight under server/ (daemon.h, options.h, listener.h) belongs to the
# top, which no room may include.
cmake_minimum_required(VERSION 3.25)  # if(IN_LIST) in script mode too
file(GLOB_RECURSE sources "${DIR}/*.h" "${DIR}/*.cc" "${DIR}/*.inc")
set(errors "")
foreach(source IN LISTS sources)
  file(STRINGS "${source}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"server/")
  foreach(line IN LISTS lines)
    if(line MATCHES "\"server/([A-Za-z0-9_]+)/")
      set(included "${CMAKE_MATCH_1}")
    else()
      set(included "top")
    endif()
    if(NOT included IN_LIST ALLOWED)
      string(STRIP "${line}" line)
      string(APPEND errors "\n  ${source}: ${line}: the ${ROOM} room may not include the "
                           "${included} room")
    endif()
  endforeach()
endforeach()
if(errors)
  string(REPLACE ";" ", " allowed_text "${ALLOWED}")
  message(FATAL_ERROR "upward include in server/${ROOM}:${errors}\n"
                      "  ${ROOM} may include: ${allowed_text} (server/CMakeLists.txt)")
endif()
