//! Sets `COSCHED_GIT_COMMIT` for `cosched_build_info`: the environment's (a packager building
//! from a tarball can say it), else the commit of the git checkout being built, else empty.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=COSCHED_GIT_COMMIT");
    let commit = match std::env::var("COSCHED_GIT_COMMIT") {
        Ok(c) => c,
        Err(_) => {
            // Built again when HEAD moves: HEAD itself, the branch it is on, the packed refs.
            let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
            watch.extend(git(&["symbolic-ref", "-q", "HEAD"]));
            for name in watch {
                if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
                    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
                    if path.exists() {
                        println!("cargo:rerun-if-changed={}", path.display());
                    }
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default()
        }
    };
    println!("cargo:rustc-env=COSCHED_GIT_COMMIT={commit}");
}
