// bitrefit/transport/transport.hpp — the transport area in one include.
#pragma once

#include "bitrefit/transport/any_transport.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/directory_store.hpp"
#include "bitrefit/transport/faulty.hpp"
#include "bitrefit/transport/inprocess.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "bitrefit/transport/s3_store.hpp"
