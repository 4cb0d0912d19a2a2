# The Python module (python/): pybind11 + the Python development files.
#   BITREFIT_BUILD_PYTHON=AUTO (default when top level) builds it when both are found, ON requires
#   them, OFF skips it. BITREFIT_PYTHON_FOUND tells the rest of the build whether it is built.
# The interpreter defaults to Debian's /usr/bin/python3 when it exists: that is the one that has
# python3-torch and python3-numpy (a `python3` earlier on PATH, e.g. a pyenv shim, usually has
# neither, and the module must be built for the interpreter that runs it). Pass
# -DPython3_EXECUTABLE=... to choose another one.
if(PROJECT_IS_TOP_LEVEL)
  set(bitrefit_python_default AUTO)
else()
  set(bitrefit_python_default OFF)
endif()
set(BITREFIT_BUILD_PYTHON ${bitrefit_python_default} CACHE STRING
    "Build the Python module: AUTO (when Python3 development files and pybind11 are found), ON or OFF")
set_property(CACHE BITREFIT_BUILD_PYTHON PROPERTY STRINGS AUTO ON OFF)

if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python interpreter (Debian's has python3-torch)")
endif()

set(BITREFIT_PYTHON_FOUND OFF)
if(NOT BITREFIT_BUILD_PYTHON STREQUAL "OFF")
  if(BITREFIT_BUILD_PYTHON STREQUAL "ON")
    set(bitrefit_python_required REQUIRED)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module ${bitrefit_python_required})
  if(Python3_FOUND)
    find_package(pybind11 2.6 CONFIG ${bitrefit_python_required})
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(BITREFIT_PYTHON_FOUND ON)
    message(STATUS "bitrefit: building the Python module for ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pybind11_VERSION}")
  else()
    message(STATUS "bitrefit: not building the Python module (needs python3-dev and pybind11-dev)")
  endif()
endif()
