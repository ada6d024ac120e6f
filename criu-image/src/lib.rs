//! CRIU image reader for gpucr (being written).
