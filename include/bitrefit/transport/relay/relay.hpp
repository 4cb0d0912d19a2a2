// bitrefit/transport/relay/relay.hpp — the relay-tree transport in one include (README.md here).
#pragma once

#include "bitrefit/transport/relay/frame_store.hpp"
#include "bitrefit/transport/relay/framing.hpp"
#include "bitrefit/transport/relay/handshake.hpp"
#include "bitrefit/transport/relay/link.hpp"
#include "bitrefit/transport/relay/node.hpp"
#include "bitrefit/transport/relay/options.hpp"
#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tls.hpp"
#include "bitrefit/transport/relay/tree.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"
