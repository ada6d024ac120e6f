//! Compile CRIU's image messages (`proto/criu/*.proto`, except the RPC protocol, which
//! the gpucr crate compiles) with prost. protox parses the .proto files in-process, so
//! no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("../proto/criu");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let is_proto = path.extension().is_some_and(|e| e == "proto");
        if is_proto && path.file_name().is_some_and(|n| n != "rpc.proto") {
            println!("cargo:rerun-if-changed={}", path.display());
            files.push(path);
        }
    }
    files.sort();
    let fds = protox::compile(&files, [&dir])?;
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(fds)?;
    Ok(())
}
