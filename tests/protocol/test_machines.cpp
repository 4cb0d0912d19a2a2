#include <gtest/gtest.h>
#include "bitrefit/protocol/protocol.hpp"
