//! Compile the helper protocol (`proto/gpucr/helper.proto`) with prost; protox parses it
//! in-process, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "../proto/gpucr/helper.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let fds = protox::compile([PROTO], ["../proto/gpucr"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
