// bitrefit/io/io.hpp — checkpoint input and output in one include.
#pragma once

#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/io/checkpoint.hpp"
#include "bitrefit/io/checkpoint_error.hpp"
#include "bitrefit/io/mapped_file.hpp"
#include "bitrefit/io/safetensors.hpp"
