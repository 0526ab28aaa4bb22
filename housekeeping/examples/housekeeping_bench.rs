//! Times scan + plan (and optionally the deletes) of a tier directory, for
//! `benches/housekeeping/run.sh`. Prints one JSON line of figures.
//!
//! `housekeeping-bench scan DIR`: scan and plan for a launch whose identity
//! matches the benchmark's main model, with a capacity of half the objects' allocated bytes (so it trims).
//! `housekeeping-bench delete DIR`: scan, plan with no manifest (so every
//! object goes) and delete.

use std::process::ExitCode;
use std::time::Instant;

use lmcache_housekeeping::{
    execute, plan, scan, Access, LaunchIdentity, ManifestRead, TierDir, TierPolicy,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: housekeeping-bench scan|delete DIR");
        return ExitCode::from(2);
    };
    let identity = LaunchIdentity {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        tensor_parallel_size: 2,
        pipeline_parallel_size: 1,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        chunk_size: 256,
        decode_context_parallel_size: 1,
        cp_kv_cache_interleave_size: 1,
        mla_only: false,
        weights: None,
        engine_settings: Default::default(),
    };
    let access = if mode == "delete" {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    let start = Instant::now();
    let dir = match TierDir::open(path, access) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let inventory = match scan(&dir) {
        Ok(inventory) => inventory,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let scanned = start.elapsed();
    let totals = inventory.totals();
    let (manifest, policy) = if mode == "delete" {
        (ManifestRead::Missing, TierPolicy::default())
    } else {
        let manifest = ManifestRead::Found(lmcache_housekeeping::Manifest {
            schema_version: 1,
            identity: identity.clone(),
            identity_digest: identity.digest(),
            writer: "bench".into(),
            written_at: "2025-01-01T00:00:00Z".into(),
        });
        let capacity = totals.objects.bytes / 2;
        let policy = TierPolicy {
            capacity_bytes: Some(capacity),
            ..TierPolicy::default()
        };
        (manifest, policy)
    };
    let planned = plan(&inventory, &identity, &manifest, policy);
    let plan_done = start.elapsed();
    let mut deleted = 0;
    if mode == "delete" {
        match execute(&dir, &inventory, &planned) {
            Ok(report) => deleted = report.deleted_total.count,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let total = start.elapsed();
    println!(
        "{{\"mode\":\"{mode}\",\"objects\":{},\"foreign\":{},\"planned_deletions\":{},\"deleted\":{deleted},\"scan_s\":{:.3},\"scan_plan_s\":{:.3},\"total_s\":{:.3}}}",
        totals.objects.count,
        totals.foreign.count,
        planned.deletions.len(),
        scanned.as_secs_f64(),
        plan_done.as_secs_f64(),
        total.as_secs_f64()
    );
    ExitCode::SUCCESS
}
