//! The engine's batched-token budget when the launch is not told it: the
//! default vLLM itself applies to `vllm serve` on the node's GPU, from its
//! `EngineArgs.get_batch_defaults` (`docs/configuration.md`, "The engine's
//! batched tokens").
//!
//! vLLM picks `max_num_batched_tokens` for an OpenAI API server (`vllm
//! serve`) from the first GPU's memory and name, as its NVML platform reads
//! them (what `nvidia-smi` shows):
//!
//! | GPU | vLLM 0.26-0.27 | vLLM 0.28 and later |
//! | --- | --- | --- |
//! | 160 GiB or more | 8192 | 16384 |
//! | 70 GiB or more, not an A100 | 8192 | 8192 |
//! | anything else, or none | 2048 | 2048 |
//!
//! The `LLM` class (offline use) and `--performance-mode throughput` get
//! other values: an engine run so gives the launch its value.
//!
//! Facts first: the launcher reads the GPU's model and the installed vLLM's
//! version once ([`EngineGpu`]); [`max_num_batched_tokens`] is the pure rule.

use serde::{Deserialize, Serialize};

use crate::{Decision, GIB};

/// vLLM's default with no GPU of 70 GiB or more, and the launch's with no
/// GPU at all.
pub const SMALL_DEFAULT: u32 = 2048;
/// vLLM's default on a GPU of 70 GiB or more that is not an A100.
pub const LARGE_DEFAULT: u32 = 8192;
/// vLLM 0.28's and later default on a GPU of 160 GiB or more.
pub const HUGE_DEFAULT: u32 = 16384;

/// The first GPU the engine sees, as the launcher read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GpuModel {
    /// Read (`nvidia-smi --query-gpu=name,memory.total`).
    Read {
        /// The GPU's name, e.g. `NVIDIA H200`.
        name: String,
        /// Its memory, bytes.
        memory_bytes: u64,
    },
    /// Not read, and why.
    Unread {
        /// What failed, for the plan's warning.
        why: String,
    },
}

/// What the rule reads of a node with a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineGpu {
    /// The first GPU the engine sees.
    pub model: GpuModel,
    /// The installed vLLM's version (its `dist-info`), when found.
    pub vllm_version: Option<String>,
}

/// The `(major, minor)` of a version such as `0.28.1`, `0.33.0rc1` or
/// `0.26.0+cu130`; `None` when it does not start with two numbers.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The engine's max batched tokens per step: `explicit`
/// (`--max-num-batched-tokens`) when given, else vLLM's default for `vllm
/// serve` on `gpu` (`None`: the node has no GPU), by the table in this
/// module's documentation.
///
/// A GPU whose model could not be read is planned at 2048 and a GPU of
/// 160 GiB or more beside an unknown vLLM at 16384 (the newer releases'):
/// [`warning`] says so, and the flag settles it.
pub fn max_num_batched_tokens(explicit: Option<u32>, gpu: Option<&EngineGpu>) -> Decision<u32> {
    if let Some(tokens) = explicit {
        return Decision::new(
            tokens,
            "explicit",
            format!("--max-num-batched-tokens {tokens}"),
        );
    }
    let Some(gpu) = gpu else {
        return Decision::new(
            SMALL_DEFAULT,
            "vllm-default-no-gpu",
            format!(
                "vLLM's default for `vllm serve` without a GPU of 70 GiB or more: {SMALL_DEFAULT}"
            ),
        );
    };
    let (name, memory_bytes) = match &gpu.model {
        GpuModel::Read { name, memory_bytes } => (name, *memory_bytes),
        GpuModel::Unread { why } => {
            return Decision::new(
                SMALL_DEFAULT,
                "vllm-default-gpu-unread",
                format!("vLLM's smallest default for `vllm serve`, {SMALL_DEFAULT}: the GPU's memory could not be read ({why})"),
            )
        }
    };
    let gib = memory_bytes as f64 / GIB as f64;
    let vllm = gpu.vllm_version.as_deref();
    let on = format!("{name} of {gib:.0} GiB");
    if memory_bytes >= 160 * GIB {
        return match vllm.and_then(major_minor) {
            Some(v) if v < (0, 28) => Decision::new(
                LARGE_DEFAULT,
                "vllm-default-70gib",
                format!("vLLM {}'s default for `vllm serve` on an {on}: {LARGE_DEFAULT} (16384 from vLLM 0.28 on)", vllm.unwrap_or("?")),
            ),
            Some(_) => Decision::new(
                HUGE_DEFAULT,
                "vllm-default-160gib",
                format!("vLLM {}'s default for `vllm serve` on an {on}: {HUGE_DEFAULT}", vllm.unwrap_or("?")),
            ),
            None => Decision::new(
                HUGE_DEFAULT,
                "vllm-default-160gib-version-unknown",
                format!("vLLM's default for `vllm serve` on an {on} from vLLM 0.28 on: {HUGE_DEFAULT} (the installed vLLM's version is unknown; 0.26 and 0.27 give {LARGE_DEFAULT})"),
            ),
        };
    }
    if memory_bytes >= 70 * GIB && !name.to_lowercase().contains("a100") {
        return Decision::new(
            LARGE_DEFAULT,
            "vllm-default-70gib",
            format!("vLLM's default for `vllm serve` on an {on}: {LARGE_DEFAULT}"),
        );
    }
    Decision::new(
        SMALL_DEFAULT,
        "vllm-default",
        format!("vLLM's default for `vllm serve` on an {on}: {SMALL_DEFAULT}"),
    )
}

/// The plan's warning for a budget [`max_num_batched_tokens`] had to
/// guess: the GPU unread, or a GPU of 160 GiB or more beside an unknown
/// vLLM. `None` otherwise.
pub fn warning(decision: &Decision<u32>) -> Option<String> {
    matches!(
        decision.rule,
        "vllm-default-gpu-unread" | "vllm-default-160gib-version-unknown"
    )
    .then(|| {
        format!(
            "the engine's max batched tokens are planned at {} ({}): the chunk size is half of it. Give `--max-num-batched-tokens` the value the engine runs with",
            decision.value, decision.reason
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, mib: u64, vllm: Option<&str>) -> EngineGpu {
        EngineGpu {
            model: GpuModel::Read {
                name: name.into(),
                memory_bytes: mib << 20,
            },
            vllm_version: vllm.map(Into::into),
        }
    }

    #[test]
    fn the_default_follows_vllm_serve_by_gpu_memory_name_and_version() {
        let cases = [
            // nvidia-smi's memory.total, MiB.
            (gpu("NVIDIA H200", 143_771, Some("0.26.0")), 8192),
            (gpu("NVIDIA H200", 143_771, Some("0.33.0")), 8192),
            (gpu("NVIDIA H100 80GB HBM3", 81_559, Some("0.26.0")), 8192),
            (gpu("NVIDIA A100-SXM4-80GB", 81_920, Some("0.26.0")), 2048),
            (gpu("NVIDIA L40S", 46_068, Some("0.33.0")), 2048),
            (gpu("NVIDIA B200", 183_359, Some("0.28.0")), 16384),
            (gpu("NVIDIA B200", 183_359, Some("0.33.0rc1")), 16384),
            (gpu("NVIDIA B200", 183_359, Some("0.27.2+cu130")), 8192),
            (gpu("NVIDIA B200", 183_359, Some("1.0.0")), 16384),
            (gpu("NVIDIA B200", 183_359, None), 16384),
            (gpu("NVIDIA H100 PCIe", 71_680, None), 8192),
            (gpu("Tesla T4", 15_360, None), 2048),
        ];
        for (gpu, tokens) in cases {
            let d = max_num_batched_tokens(None, Some(&gpu));
            assert_eq!(d.value, tokens, "{gpu:?}: {}", d.reason);
            assert!(d.reason.contains(&tokens.to_string()), "{}", d.reason);
        }
        let none = max_num_batched_tokens(None, None);
        assert_eq!((none.value, none.rule), (2048, "vllm-default-no-gpu"));
        assert_eq!(warning(&none), None);
    }

    #[test]
    fn the_flag_wins_and_a_guess_is_warned_about() {
        let h200 = gpu("NVIDIA H200", 143_771, Some("0.26.0"));
        let d = max_num_batched_tokens(Some(4096), Some(&h200));
        assert_eq!((d.value, d.rule), (4096, "explicit"));
        assert_eq!(warning(&d), None);
        assert_eq!(warning(&max_num_batched_tokens(None, Some(&h200))), None);
        let unread = EngineGpu {
            model: GpuModel::Unread {
                why: "nvidia-smi: not found".into(),
            },
            vllm_version: None,
        };
        let d = max_num_batched_tokens(None, Some(&unread));
        assert_eq!(d.value, 2048);
        let w = warning(&d).unwrap();
        assert!(
            w.contains("nvidia-smi: not found") && w.contains("--max-num-batched-tokens"),
            "{w}"
        );
        let b200 = gpu("NVIDIA B200", 183_359, None);
        let w = warning(&max_num_batched_tokens(None, Some(&b200))).unwrap();
        assert!(
            w.contains("16384") && w.contains("0.26 and 0.27 give 8192"),
            "{w}"
        );
    }

    #[test]
    fn versions_are_read_by_their_first_two_numbers() {
        assert_eq!(major_minor("0.26.0"), Some((0, 26)));
        assert_eq!(major_minor("0.33.0rc2"), Some((0, 33)));
        assert_eq!(major_minor("0.28rc1"), Some((0, 28)));
        assert_eq!(major_minor("1.2.3+cu130"), Some((1, 2)));
        assert_eq!(major_minor("dev"), None);
        assert_eq!(major_minor("0"), None);
        assert_eq!(major_minor(""), None);
    }
}
