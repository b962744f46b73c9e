//! Half-closed connections.
