//! What the weights' fingerprint of the cache identity costs (target: at
//! most 50 ms for a 140 GB, 30-shard model directory, and no read of weight
//! data; `docs/performance.md`), beside a full blake3 read of the same
//! directory, in one run.
//!
//! The directory is laid out as a Hugging Face safetensors checkpoint: 30
//! shards of equal size (sparse files, so they take no disk), their index,
//! `config.json`, `generation_config.json` and the tokenizer's files, in a
//! scratch directory under `TMPDIR`. Measured: `weights::measure` on it
//! (`RUNS` times, default 200), then `FULL_READS` (default 1) blake3 hashes
//! of every file's bytes read in 1 MiB pieces. `GB` (default 140) and
//! `SHARDS` (default 30) change the model. As root, the kernel's caches
//! are dropped (`/proc/sys/vm/drop_caches`) after the layout, so the first
//! measure is a cold one and is shown apart. Run: `cargo bench -p
//! lmcache-launcher --bench weights_fingerprint`.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use lmcache_launcher::node::env::Vars;
use lmcache_launcher::plan::weights::{self, Source, Weights};

/// A setting from the environment, else `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median, 99th percentile and maximum of `samples`, in milliseconds.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    format!(
        "median {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} runs)",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(*samples.last().unwrap()),
        samples.len()
    )
}

/// Lays out the checkpoint in `dir`: `shards` sparse shards of `bytes` in
/// all, and the small files beside them.
fn checkpoint(dir: &Path, shards: u64, bytes: u64) {
    let mut index = serde_json::Map::new();
    for i in 1..=shards {
        let name = format!("model-{i:05}-of-{shards:05}.safetensors");
        fs::File::create(dir.join(&name))
            .unwrap()
            .set_len(bytes / shards)
            .unwrap();
        index.insert(format!("model.layers.{i}.mlp.weight"), name.into());
    }
    let index = serde_json::json!({"metadata": {"total_size": bytes}, "weight_map": index});
    fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"rope_scaling":{"rope_type":"llama3","factor":8.0},"torch_dtype":"bfloat16"}"#,
    )
    .unwrap();
    fs::write(dir.join("generation_config.json"), r#"{"temperature":0.6}"#).unwrap();
    fs::write(dir.join("tokenizer.json"), vec![b' '; 9 << 20]).unwrap();
    fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
}

/// blake3 of every file of `dir` in name order, read in 1 MiB pieces;
/// returns the bytes read.
fn full_read(dir: &Path) -> u64 {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for path in names {
        let mut file = fs::File::open(path).unwrap();
        loop {
            let n = file.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
    }
    std::hint::black_box(hasher.finalize());
    total
}

fn main() {
    let (gb, shards) = (setting("GB", 140), setting("SHARDS", 30));
    let runs = setting("RUNS", 200) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    fs::create_dir(&dir).unwrap();
    checkpoint(&dir, shards, gb * 1_000_000_000);
    let model = dir.to_str().unwrap();
    let source = Source {
        model,
        revision: None,
        download_dir: None,
        given: None,
    };
    let vars = Vars::new();
    let cold = fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    let started = Instant::now();
    let first = weights::measure(source, &vars);
    let first_took = started.elapsed();
    let Weights::Files { files, bytes, .. } = &first else {
        panic!("{first:?}");
    };
    println!(
        "model: {gb} GB in {shards} shards at {model}: {files} files counted, {bytes} bytes, fingerprint {}",
        first.fingerprint().unwrap()
    );
    println!(
        "weights::measure, first run{}: {:.3} ms",
        if cold {
            " (caches dropped)"
        } else {
            " (caches not dropped: not root)"
        },
        first_took.as_secs_f64() * 1e3
    );
    let samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(weights::measure(source, &vars));
            started.elapsed()
        })
        .collect();
    println!("weights::measure: {}", summary(samples));
    for _ in 0..setting("FULL_READS", 1) {
        let started = Instant::now();
        let read = full_read(&dir);
        let took = started.elapsed();
        println!(
            "full blake3 read: {read} bytes in {:.1} s ({:.2} GB/s)",
            took.as_secs_f64(),
            read as f64 / took.as_secs_f64() / 1e9
        );
    }
}
