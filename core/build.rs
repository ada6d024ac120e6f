//! Compile the CRIU RPC protocol (`proto/criu/rpc.proto`) with prost.
//!
//! protox parses the .proto in-process, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RPC: &str = "../proto/criu/rpc.proto";
    println!("cargo:rerun-if-changed={RPC}");
    let fds = protox::compile([RPC], ["../proto/criu"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
