//! GPU topology for gpucr (being written).
