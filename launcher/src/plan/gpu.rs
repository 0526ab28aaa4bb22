//! The node's GPUs, and whether LMCache's compiled extensions load in the
//! Python environment the server will run in.
//!
//! Why: LMCache imports its compiled `lmcache.cuda_ops` lazily and, when the
//! import fails (a wheel built against another torch than the one
//! installed: an undefined C++ symbol), logs one line and carries on with
//! its torch baseline, slower, on a GPU node. The launch says so up front
//! (`docs/operations.md`, "LMCache's compiled extensions"). On a node
//! without a GPU nothing is checked and nothing is said.
//!
//! Facts first: [`visible_gpus`] counts the GPUs the server would see and
//! [`check_extensions`] runs the server's Python once, with a time limit;
//! [`warning`] is the pure rule that turns the result into the plan's
//! warning.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use lmcache_sizing::engine::{EngineGpu, GpuModel};

use crate::plan::locate;
use crate::plan::server_python::{self, RunError};
use crate::Vars;

/// How long [`check_extensions`] waits for the server's Python: importing
/// torch from a cold page cache takes seconds; 1.7 s here with a warm one.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// What the plan knows of the node's GPUs. Present only on a node where
/// the server would see at least one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// NVIDIA GPUs the server would see ([`visible_gpus`]).
    pub devices: u32,
    /// What importing LMCache's compiled extensions did.
    pub extensions: ExtensionCheck,
}

/// What importing LMCache's compiled extensions (each `lmcache/*.so`) in
/// the server's Python did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ExtensionCheck {
    /// Every extension loaded.
    Loaded {
        /// `torch.__version__`, when torch imported.
        torch: Option<String>,
        /// The extensions, e.g. `lmcache.cuda_ops`.
        extensions: Vec<String>,
    },
    /// At least one did not.
    Failed {
        /// `torch.__version__`, when torch imported.
        torch: Option<String>,
        /// Each one that did not, with Python's error.
        failures: Vec<ExtensionFailure>,
    },
    /// The check could not run, or did not finish in [`CHECK_TIMEOUT`].
    Unchecked {
        /// Why.
        why: String,
    },
}

/// An extension that did not load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtensionFailure {
    /// The module, e.g. `lmcache.cuda_ops` (or `torch`, or `lmcache`).
    pub extension: String,
    /// Python's error, e.g. `ImportError: ...: undefined symbol: ...`.
    pub error: String,
}

/// The NVIDIA GPUs the server would see: those of the node (the
/// `/dev/nvidia<N>` device nodes, else the driver's
/// `/proc/driver/nvidia/gpus` entries: a container sees those of its GPUs),
/// as `CUDA_VISIBLE_DEVICES` in `vars` narrows them ([`cuda_visible`]).
pub fn visible_gpus(vars: &Vars) -> u32 {
    let device_nodes = count_entries(Path::new("/dev"), |name| {
        name.strip_prefix("nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    let driver_entries = count_entries(Path::new("/proc/driver/nvidia/gpus"), |_| true);
    let setting = vars
        .get(OsStr::new("CUDA_VISIBLE_DEVICES"))
        .map(|v| v.to_string_lossy());
    cuda_visible(setting.as_deref(), device_nodes.max(driver_entries))
}

/// How many of a node's `devices` GPUs CUDA shows a process whose
/// `CUDA_VISIBLE_DEVICES` is `setting`, as the CUDA runtime reads it: unset,
/// all of them; otherwise the comma-separated entries up to the first that
/// is not a device (an index below `devices`, or a `GPU-`/`MIG-` UUID),
/// so `""`, `"-1"` and `"NoDevFiles"` show none and `"0,-1,1"` shows one.
pub fn cuda_visible(setting: Option<&str>, devices: u32) -> u32 {
    let Some(setting) = setting else {
        return devices;
    };
    let entries = setting
        .split(',')
        .map(str::trim)
        .take_while(|entry| {
            entry.starts_with("GPU-")
                || entry.starts_with("MIG-")
                || entry.parse::<u32>().is_ok_and(|index| index < devices)
        })
        .count();
    u32::try_from(entries).unwrap_or(u32::MAX).min(devices)
}

fn count_entries(dir: &Path, wanted: impl Fn(&str) -> bool) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let count = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(&wanted))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The facts of a node whose server would run the stock `lmcache` command
/// `stock` with the environment `vars`: `None` without a visible GPU.
pub fn measure(stock: &Path, vars: &Vars) -> Option<GpuFacts> {
    let devices = visible_gpus(vars);
    (devices > 0).then(|| GpuFacts {
        devices,
        extensions: check_extensions(stock, vars, CHECK_TIMEOUT),
    })
}

/// How long [`engine_gpu`] waits for `nvidia-smi`.
pub const SMI_TIMEOUT: Duration = Duration::from_secs(15);

/// What the engine's batched-token default is read from on a node whose
/// environment is `vars` ([`lmcache_sizing::engine`]): the first GPU the
/// engine sees, as `nvidia-smi` names it (vLLM reads the same through NVML),
/// and the version of the vLLM on `PATH`. `None` without a visible GPU.
pub fn engine_gpu(vars: &Vars) -> Option<EngineGpu> {
    (visible_gpus(vars) > 0).then(|| EngineGpu {
        model: gpu_model(vars),
        vllm_version: locate::which("vllm", vars)
            .and_then(|vllm| locate::package_version(&vllm, "vllm")),
    })
}

/// The first GPU the engine sees (`CUDA_VISIBLE_DEVICES`'s first entry, else
/// GPU 0) by `nvidia-smi --query-gpu=name,memory.total`.
fn gpu_model(vars: &Vars) -> GpuModel {
    let Some(smi) = locate::which("nvidia-smi", vars) else {
        return GpuModel::Unread {
            why: "nvidia-smi is not on PATH".into(),
        };
    };
    let first = vars
        .get(OsStr::new("CUDA_VISIBLE_DEVICES"))
        .and_then(|v| {
            v.to_str()
                .map(|v| v.split(',').next().unwrap_or("").trim().to_string())
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "0".into());
    let mut command = std::process::Command::new(&smi);
    command
        .args([
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
            "-i",
        ])
        .arg(&first)
        .env_clear()
        .envs(vars.iter());
    let why = match server_python::run_bounded(command, SMI_TIMEOUT) {
        Ok(ran) if ran.status.success() => match read_smi(&ran.stdout) {
            Some(model) => return model,
            None => format!("nvidia-smi printed {:?}", capped(&ran.stdout)),
        },
        Ok(ran) => format!(
            "nvidia-smi -i {first} exited with {}: {}",
            ran.status,
            capped(&ran.stderr)
        ),
        Err(RunError::NotRun(e)) => format!("nvidia-smi cannot run: {e}"),
        Err(RunError::TimedOut) => format!(
            "nvidia-smi gave no answer within {} s",
            SMI_TIMEOUT.as_secs()
        ),
    };
    GpuModel::Unread { why }
}

fn capped(text: &str) -> String {
    lmcache_tier_spec::shown_value(text.trim())
}

/// `NVIDIA H200, 143771` (the name, then MiB) as a [`GpuModel::Read`].
fn read_smi(stdout: &str) -> Option<GpuModel> {
    let line = stdout.lines().find(|l| !l.trim().is_empty())?;
    let (name, mib) = line.rsplit_once(',')?;
    let mib: u64 = mib.trim().parse().ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| GpuModel::Read {
        name: name.to_string(),
        memory_bytes: mib.saturating_mul(1 << 20),
    })
}

/// Imports torch and every compiled extension of the `lmcache` package in
/// the Python that `stock` runs ([`server_python::python_of`]), with the
/// environment `vars` (less LMCache's own logging), within `timeout`.
pub fn check_extensions(stock: &Path, vars: &Vars, timeout: Duration) -> ExtensionCheck {
    let python = server_python::python_of(stock);
    let mut command = server_python::command(&python, vars);
    command
        .env("LMCACHE_LOG_LEVEL", "ERROR")
        .env("LMCACHE_TRACK_USAGE", "false")
        .args(["-c", PROBE]);
    let why = match server_python::run_bounded(command, timeout) {
        Ok(ran) if ran.status.success() => return read_probe(ran.stdout.as_bytes()),
        Ok(ran) => format!("the check exited with {}", ran.status),
        Err(RunError::NotRun(e)) => format!("cannot run: {e}"),
        Err(RunError::TimedOut) => format!("no answer within {} s", timeout.as_secs()),
    };
    ExtensionCheck::Unchecked {
        why: format!("{}: {why}", server_python::shown(&python)),
    }
}

/// What the probe printed last: one JSON object
/// `{"torch": str|null, "loaded": [str], "failed": [{"extension", "error"}]}`.
fn read_probe(stdout: &[u8]) -> ExtensionCheck {
    #[derive(Deserialize)]
    struct Probe {
        torch: Option<String>,
        loaded: Vec<String>,
        failed: Vec<ExtensionFailure>,
    }
    let text = String::from_utf8_lossy(stdout);
    let last = text.lines().rev().find(|l| !l.trim().is_empty());
    match last.map(serde_json::from_str::<Probe>) {
        Some(Ok(p)) if p.failed.is_empty() => ExtensionCheck::Loaded {
            torch: p.torch,
            extensions: p.loaded,
        },
        Some(Ok(p)) => ExtensionCheck::Failed {
            torch: p.torch,
            failures: p.failed,
        },
        _ => ExtensionCheck::Unchecked {
            why: "the check printed no result".into(),
        },
    }
}

/// The probe the server's Python runs: torch first (the extensions link
/// against it), then the `lmcache` package, then every compiled module at
/// its top and `cuda_ops` whether or not a file of it is there (a build
/// without it runs on the torch baseline too), as LMCache imports them.
const PROBE: &str = r#"
import importlib, json, os
out = {"torch": None, "loaded": [], "failed": []}
def fail(name, e):
    out["failed"].append({"extension": name, "error": f"{type(e).__name__}: {e}"})
try:
    import torch
    out["torch"] = torch.__version__
except Exception as e:
    fail("torch", e)
try:
    import lmcache
    folder = list(lmcache.__path__)[0]
except Exception as e:
    fail("lmcache", e)
else:
    names = sorted({f.split(".")[0] for f in os.listdir(folder) if f.endswith(".so")} | {"cuda_ops"})
    for name in names:
        try:
            importlib.import_module("lmcache." + name)
            out["loaded"].append("lmcache." + name)
        except Exception as e:
            fail("lmcache." + name, e)
print(json.dumps(out))
"#;

/// The plan's warning for `gpu`: `None` when every extension loaded.
/// Source of the rule: LMCache 0.5.6 falls back to its torch baseline
/// when `lmcache.cuda_ops` does not import, and says so only in its log.
pub fn warning(gpu: &GpuFacts) -> Option<String> {
    match &gpu.extensions {
        ExtensionCheck::Loaded { .. } => None,
        ExtensionCheck::Failed { torch, failures } => {
            let each = |wanted: &dyn Fn(&str) -> bool| {
                failures
                    .iter()
                    .filter(|f| wanted(&f.extension))
                    .map(|f| format!("{} ({})", f.extension, f.error))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let packages = each(&|name| matches!(name, "torch" | "lmcache"));
            if !packages.is_empty() {
                return Some(format!(
                    "on this GPU node the LMCache server's Python cannot import {packages}: the server will not start. Install LMCache and the torch it needs in that environment"
                ));
            }
            Some(format!(
                "on this GPU node LMCache's compiled extensions do not load with torch {}: {}. LMCache carries on without them, on its slower torch baseline. Install the LMCache build made for this torch, or build LMCache from its source distribution against it",
                torch.as_deref().unwrap_or("?"),
                each(&|_| true)
            ))
        }
        ExtensionCheck::Unchecked { why } => Some(format!(
            "on this GPU node it could not be checked whether LMCache's compiled extensions load: {why}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn cuda_visible_devices_is_read_as_cuda_reads_it() {
        for (setting, seen) in [
            (None, 4),
            (Some(""), 0),
            (Some(" "), 0),
            (Some("-1"), 0),
            (Some("-1,0"), 0),
            (Some(","), 0),
            (Some("NoDevFiles"), 0),
            (Some("5"), 0),
            (Some("0"), 1),
            (Some("0,-1,1"), 1),
            (Some("2, 3"), 2),
            (Some("GPU-51625c74-fddb,GPU-7f7c6807"), 2),
            (Some("MIG-a,MIG-b,MIG-c,MIG-d,MIG-e"), 4),
        ] {
            assert_eq!(cuda_visible(setting, 4), seen, "{setting:?}");
        }
        assert_eq!(visible_gpus(&vars(&[("CUDA_VISIBLE_DEVICES", "-1")])), 0);
    }

    #[test]
    fn a_package_that_does_not_import_is_named_as_fatal() {
        let gpu = GpuFacts {
            devices: 1,
            extensions: ExtensionCheck::Failed {
                torch: Some("2.11.0".into()),
                failures: vec![ExtensionFailure {
                    extension: "lmcache".into(),
                    error: "RuntimeError: broken package init".into(),
                }],
            },
        };
        let text = warning(&gpu).unwrap();
        assert!(
            text.contains("cannot import lmcache (RuntimeError: broken package init)")
                && text.contains("will not start")
                && !text.contains("torch baseline"),
            "{text}"
        );
    }

    #[test]
    fn nvidia_smis_answer_is_read_as_name_and_mib() {
        assert_eq!(
            read_smi("NVIDIA H200, 143771\n"),
            Some(GpuModel::Read {
                name: "NVIDIA H200".into(),
                memory_bytes: 143_771 << 20
            })
        );
        assert_eq!(
            read_smi("\nNVIDIA A100-SXM4-80GB, 81920\nNVIDIA A100-SXM4-80GB, 81920\n"),
            Some(GpuModel::Read {
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_bytes: 81_920 << 20
            })
        );
        for odd in [
            "",
            "NVIDIA H200",
            "NVIDIA H200, [N/A]",
            ", 1024",
            "No devices were found",
        ] {
            assert_eq!(read_smi(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn the_probes_last_line_is_the_result() {
        let failed = read_probe(
            b"noise\n{\"torch\": \"2.11.0+cu130\", \"loaded\": [\"lmcache.lmcache_fs\"], \"failed\": [{\"extension\": \"lmcache.cuda_ops\", \"error\": \"ImportError: undefined symbol\"}]}\n",
        );
        let ExtensionCheck::Failed { torch, failures } = &failed else {
            panic!("{failed:?}")
        };
        assert_eq!(torch.as_deref(), Some("2.11.0+cu130"));
        assert_eq!(failures[0].extension, "lmcache.cuda_ops");
        let loaded =
            read_probe(br#"{"torch": "2.13.0", "loaded": ["lmcache.cuda_ops"], "failed": []}"#);
        assert!(
            matches!(loaded, ExtensionCheck::Loaded { .. }),
            "{loaded:?}"
        );
        for garbage in [&b""[..], b"Traceback", b"{\"torch\": 1}"] {
            assert!(matches!(
                read_probe(garbage),
                ExtensionCheck::Unchecked { .. }
            ));
        }
    }

    #[test]
    fn the_warning_names_torch_the_extension_and_the_error() {
        let gpu = GpuFacts {
            devices: 1,
            extensions: ExtensionCheck::Failed {
                torch: Some("2.11.0+cu130".into()),
                failures: vec![ExtensionFailure {
                    extension: "lmcache.cuda_ops".into(),
                    error: "ImportError: undefined symbol: _ZN3c10".into(),
                }],
            },
        };
        let text = warning(&gpu).unwrap();
        for needle in ["torch 2.11.0+cu130", "lmcache.cuda_ops", "undefined symbol"] {
            assert!(text.contains(needle), "{text}");
        }
        let fine = GpuFacts {
            devices: 1,
            extensions: ExtensionCheck::Loaded {
                torch: None,
                extensions: vec![],
            },
        };
        assert_eq!(warning(&fine), None);
    }

    #[test]
    fn a_stand_in_whose_extension_is_broken_fails_and_a_slow_one_is_cut_off() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path();
        let package = venv.join("site/lmcache");
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join("__init__.py"), "").unwrap();
        std::fs::write(
            package.join("cuda_ops.cpython-311-x86_64-linux-gnu.so"),
            "not ELF",
        )
        .unwrap();
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let stock = venv.join("bin/lmcache");
        std::fs::write(&stock, "#!/usr/bin/python3\n").unwrap();
        let site = package.parent().unwrap().display().to_string();
        let env = vars(&[("PYTHONPATH", &site), ("PATH", "/usr/bin:/bin")]);
        let check = check_extensions(&stock, &env, CHECK_TIMEOUT);
        let ExtensionCheck::Failed { failures, .. } = &check else {
            panic!("{check:?}")
        };
        let cuda = failures
            .iter()
            .find(|f| f.extension == "lmcache.cuda_ops")
            .unwrap_or_else(|| panic!("{check:?}"));
        assert!(cuda.error.starts_with("ImportError"), "{cuda:?}");

        // A build without cuda_ops at all runs on the torch baseline too.
        std::fs::remove_file(package.join("cuda_ops.cpython-311-x86_64-linux-gnu.so")).unwrap();
        let check = check_extensions(&stock, &env, CHECK_TIMEOUT);
        assert!(
            format!("{check:?}")
                .contains("ModuleNotFoundError: No module named 'lmcache.cuda_ops'"),
            "{check:?}"
        );

        // A package that does not import is named as itself.
        std::fs::write(
            package.join("__init__.py"),
            "raise RuntimeError('broken')\n",
        )
        .unwrap();
        let check = check_extensions(&stock, &env, CHECK_TIMEOUT);
        let ExtensionCheck::Failed { failures, .. } = &check else {
            panic!("{check:?}")
        };
        assert!(
            failures
                .iter()
                .any(|f| f.extension == "lmcache" && f.error == "RuntimeError: broken"),
            "{check:?}"
        );
        assert!(!failures.iter().any(|f| f.extension.starts_with("lmcache.")));

        std::fs::write(package.join("__init__.py"), "import time\ntime.sleep(30)\n").unwrap();
        let slow = check_extensions(&stock, &env, Duration::from_millis(500));
        let ExtensionCheck::Unchecked { why } = &slow else {
            panic!("{slow:?}")
        };
        assert!(why.contains("no answer within"), "{why}");
    }
}
