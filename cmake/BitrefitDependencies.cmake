# Finds the third-party libraries behind the bitrefit targets. Installed by scripts/install-deps.sh.
find_package(Threads REQUIRED)
find_package(zstd CONFIG REQUIRED)           # zstd::libzstd_shared
find_package(nlohmann_json 3.10 REQUIRED)    # nlohmann_json::nlohmann_json
# Boost::headers (Asio is header-only): only bitrefit::asio needs it; without it that target is
# not defined and everything else builds.
find_package(Boost 1.74 QUIET)
if(NOT Boost_FOUND)
  message(STATUS "bitrefit: Boost not found; bitrefit::asio is not defined")
endif()
# Distributed stores (bitrefit::s3, bitrefit::etcd): libcurl (HTTP, AWS SigV4), OpenSSL (SHA-256,
# MD5, base64), pugixml (S3's XML answers); the relay tree (bitrefit::asio): OpenSSL's TLS.
find_package(CURL 7.75 REQUIRED)             # CURL::libcurl (CURLOPT_AWS_SIGV4 since 7.75)
find_package(OpenSSL 1.1.1 REQUIRED)         # OpenSSL::SSL (relay tree mutual TLS), OpenSSL::Crypto
find_package(pugixml REQUIRED)               # pugixml::pugixml

# xxhash: used header-only (XXH_INLINE_ALL), so only its include directory is needed.
find_path(BITREFIT_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
if(NOT TARGET bitrefit_xxhash)
  add_library(bitrefit_xxhash INTERFACE)
  target_include_directories(bitrefit_xxhash SYSTEM INTERFACE $<BUILD_INTERFACE:${BITREFIT_XXHASH_INCLUDE_DIR}>)
endif()

# Thrust/CCCL: the CUDA Toolkit's copy is the one Thrust; Debian's libthrust-dev is the fallback.
find_path(BITREFIT_THRUST_INCLUDE_DIR thrust/version.h
  HINTS /usr/local/cuda/include/cccl /usr/local/cuda/include)
if(NOT TARGET bitrefit_thrust)
  add_library(bitrefit_thrust INTERFACE)
  if(BITREFIT_THRUST_INCLUDE_DIR)
    target_include_directories(bitrefit_thrust SYSTEM INTERFACE $<BUILD_INTERFACE:${BITREFIT_THRUST_INCLUDE_DIR}>)
  endif()
endif()
