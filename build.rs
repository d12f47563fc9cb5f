//! Build script: with the `cuda` feature, compiles every `kernels/*.cu` to PTX with nvcc
//! (compute_90: the driver JIT-compiles it for sm_90 and for newer parts such as sm_100), written
//! to `$OUT_DIR/<name>.ptx` and embedded by `src/cuda/kernels.rs`. Without the feature it does
//! nothing. Knows nothing of what the kernels compute.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = nvcc_path();
    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ is missing")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for src in sources {
        let stem = src
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("kernel file name");
        let ptx = out.join(format!("{stem}.ptx"));
        let status = Command::new(&nvcc)
            .args([
                "--ptx",
                "-arch=compute_90",
                "-O3",
                "-std=c++17",
                "-lineinfo",
            ])
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "could not run {} ({e}): the cuda feature needs nvcc; \
                     run `bash scripts/cuda-toolchain.sh` and set CUDA_HOME (README: GPU build)",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}

fn nvcc_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = Path::new(&home).join("bin").join("nvcc");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("nvcc")
}
