//! `s3_bucket` on `s3` tiers: path-style addressing through a loopback
//! gateway, with the operator's credentials kept off LMCache's command line
//! and environment (`docs/s3-gateway.md`).
//!
//! [`Gateways::start`] takes a cascade of tier specs, starts one gateway
//! per tier of type `s3` that names an `s3_bucket`, and returns the cascade
//! with those tiers rewritten to point at the gateways; every other tier is
//! returned unchanged. [`Gateways::start_args`] does the same for the
//! arguments of an `lmcache` command (`server ...` or `bench l2 ...`). The key LMCache signs with reaches it
//! through its environment ([`Gateways::server_env`]), never its command
//! line, and each gateway serves only connections from this process's uid,
//! the uid the server runs as ([`peer`]). The gateways run on their own
//! threads until the [`Gateways`] value is dropped.

pub mod adapter;
pub mod bound;
mod client;
mod client_fault;
pub mod credentials;
mod gateway;
pub mod key;
pub mod node_id;
pub mod peer;
pub mod sigv4;
pub mod spec;
pub mod state;
mod store;

pub use gateway::{COMPLETE_SILENCE, UPSTREAM_SILENCE};
/// The fleet's machines (`lmcache-bucket-fleet`), which [`bound`] drives
/// against the real store, and the layout of a bound's prefix, the cache
/// identity's segments included: the gateway's state and spec carry their
/// types.
pub use lmcache_bucket_fleet::{self as fleet, identity};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmcache_tier_spec::{Cascade, L2AdapterArgs, TierSpec};
use sigv4::KeyPair;
use spec::{BucketSpecError, BucketTier};
use state::Stats;

/// Why [`capped_body`] gave up on a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than the limit; nothing more was read.
    #[error("the body is larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The connection broke before the body was complete.
    #[error("body cut short: {0}")]
    CutShort(String),
}

/// Reads `response`'s body, at most `limit` bytes: an answer from a local
/// port that any process may hold is not trusted to be small. Used for the
/// gateway's state route here and for LMCache's `/status` by the launcher.
///
/// # Errors
/// [`BodyError::TooLarge`] (nothing more is read) or [`BodyError::CutShort`].
pub async fn capped_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyError::CutShort(lmcache_tier_spec::error_chain(&e.without_url())))?
    {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why the gateways could not start; no server may start then.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A tier's spec cannot work (bad key, unreachable endpoint, refused
    /// credentials, missing bucket).
    #[error(transparent)]
    Spec(#[from] BucketSpecError),
    /// The gateway's runtime or listener could not be set up.
    #[error("cannot start the S3 gateway: {0}")]
    Io(#[from] std::io::Error),
}

/// The variables botocore's default chain reads besides
/// [`credentials::CREDENTIAL_ENV`] ([`server_env_removed`]).
const BOTOCORE_ENV: &[&str] = &[
    "AWS_DEFAULT_PROFILE",
    "AWS_SECURITY_TOKEN",
    "AWS_CREDENTIAL_EXPIRATION",
];

/// The variables [`Gateways::server_env`] removes from the server's
/// environment, and that no process started for it may get: the AWS
/// credential variables the gateways read ([`credentials::CREDENTIAL_ENV`])
/// and those botocore's default chain reads besides (`AWS_DEFAULT_PROFILE`,
/// `AWS_SECURITY_TOKEN`, `AWS_CREDENTIAL_EXPIRATION`), so that boto3 in
/// LMCache finds the per-launch key and nothing of the operator's.
pub fn server_env_removed() -> impl Iterator<Item = &'static str> {
    credentials::CREDENTIAL_ENV
        .iter()
        .chain(BOTOCORE_ENV)
        .copied()
}

/// The running gateways of one launch; dropping it stops them.
pub struct Gateways {
    runtime: Option<tokio::runtime::Runtime>,
    addresses: Vec<(usize, SocketAddr)>,
    /// The per-launch key every gateway of the launch accepts; `None`
    /// without gateways.
    key: Option<KeyPair>,
    view: GatewaysView,
    /// The bucket bounds of the gateways, released when they stop.
    bounds: Vec<Arc<bound::Bound>>,
}

/// The counters of a launch's gateways, readable from anywhere while they
/// run: the same numbers each gateway answers on [`state::STATE_PATH`]
/// (which `lmcache-tier inspect` reads). Reading takes no lock a request
/// takes, except for the last upstream error.
#[derive(Clone, Default)]
pub struct GatewaysView(Vec<Arc<Stats>>);

impl GatewaysView {
    /// Each gateway's state as of now, in cascade order.
    pub fn states(&self) -> Vec<state::GatewayState> {
        self.0.iter().map(|stats| stats.snapshot()).collect()
    }
}

impl std::fmt::Debug for GatewaysView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GatewaysView({} gateways)", self.0.len())
    }
}

impl std::fmt::Debug for Gateways {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateways")
            .field("addresses", &self.addresses)
            .finish()
    }
}

impl Gateways {
    /// Starts a gateway for every tier of `tiers` of type `s3` with
    /// `s3_bucket`, after checking each spec and the bucket (a signed HEAD
    /// with the real credentials). Returns the cascade with those tiers
    /// rewritten to point at their gateways ([`BucketTier::rewrite`]),
    /// every other tier unchanged, and the running gateways.
    ///
    /// `env` looks up the launcher's environment for the AWS credential
    /// variables ([`credentials`] says which, and what `aws-config` reads
    /// from the process environment itself). Tiers are counted from 0 in
    /// cascade order. Errors name the tier and key at fault; a tier without
    /// credentials fails with the sources tried, and an `s3` tier without
    /// `s3_bucket` that would sign with the per-launch key fails too
    /// ([`spec::check_default_chain`]).
    ///
    /// Every gateway of the call accepts one per-launch key pair, which the
    /// server gets from [`Gateways::server_env`], and only connections
    /// whose socket belongs to this process's effective uid.
    pub async fn start(
        tiers: &Cascade,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        node_dir: Option<&Path>,
    ) -> Result<(Cascade, Gateways), GatewayError> {
        spec::check_default_chain(tiers.tiers().iter())?;
        spec::check_overlapping_prefixes(tiers.tiers())?;
        let mut bucket_tiers = Vec::new();
        for (position, spec) in tiers.tiers().iter().enumerate() {
            if let Some(tier) = BucketTier::from_spec(spec, position, env)? {
                let bound = match bound::BoundSpec::from_spec(spec, position)
                    .map_err(BucketSpecError::from)?
                {
                    Some(bound) => {
                        let models = fleet::rule::models_of(spec, position);
                        Some((bound, models.map_err(BucketSpecError::from)?))
                    }
                    None => None,
                };
                bucket_tiers.push((tier, bound));
            }
        }
        let mut gateways = Gateways {
            runtime: None,
            addresses: Vec::new(),
            key: None,
            view: GatewaysView::default(),
            bounds: Vec::new(),
        };
        if bucket_tiers.is_empty() {
            return Ok((tiers.clone(), gateways));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-gateway")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        // Owned by `gateways` from here: its Drop stops the runtime without
        // blocking, also on the error paths below.
        gateways.runtime = Some(runtime);
        let key = KeyPair::random()?;
        let server_uid = nix::unistd::geteuid().as_raw();
        for (tier, bound) in bucket_tiers {
            let position = tier.position;
            let node_file = node_dir
                .map(|dir| node_id::file_in(dir, &tier.endpoint, &tier.bucket, &tier.key_prefix));
            let started = handle
                .spawn(start_one(tier, bound, node_file, key.clone(), server_uid))
                .await
                .map_err(std::io::Error::other)??;
            let Started {
                addr,
                source,
                stats,
                bound,
            } = started;
            gateways.view.0.push(stats);
            gateways.bounds.extend(bound);
            tracing::info!(
                tier = position,
                credentials = %source,
                "S3 gateway for {} listening on {addr}",
                tiers.0[position]
                    .as_object()
                    .get("s3_bucket")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
            );
            gateways.addresses.push((position, addr));
        }
        gateways.key = Some(key);
        let mut out = tiers.clone();
        gateways.point_tiers(&mut out);
        Ok((out, gateways))
    }

    /// Points each `s3_bucket` tier of `cascade` (the one the gateways were
    /// started for) at its gateway ([`BucketTier::rewrite`]); every other
    /// tier is left as it is.
    pub fn point_tiers(&self, cascade: &mut Cascade) {
        for (position, address) in &self.addresses {
            if let Some(spec) = cascade.0.get_mut(*position) {
                *spec = BucketTier::rewrite(spec, *address);
            }
        }
    }

    /// [`Gateways::start`] for a caller that has only the arguments of an
    /// `lmcache` command (`server ...` or `bench l2 ...`: `erebine-lmcache`,
    /// tests): the usable `--l2-adapter` values (either `--l2-adapter JSON`
    /// or `--l2-adapter=JSON`) are the cascade, and the arguments come back
    /// with the rewritten specs in their places ([`L2AdapterArgs::render`]).
    ///
    /// # Errors
    /// Those of [`Gateways::start`].
    pub async fn start_args(
        args: &[String],
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        node_dir: Option<&Path>,
    ) -> Result<(Vec<String>, Gateways), GatewayError> {
        let specs = L2AdapterArgs::parse(args);
        let (tiers, gateways) = Self::start(&specs.cascade(), env, node_dir).await?;
        Ok((specs.render(args, &tiers), gateways))
    }

    /// The gateways' counters, for a reader that outlives this borrow
    /// (the metrics endpoint).
    pub fn view(&self) -> GatewaysView {
        self.view.clone()
    }

    /// Where each gateway listens: (tier position, `127.0.0.1:<port>`).
    pub fn addresses(&self) -> &[(usize, SocketAddr)] {
        &self.addresses
    }

    /// The per-launch key every gateway of the launch accepts, for a
    /// client in this process (tests, benchmarks); `None` without
    /// gateways. The server gets it from [`Gateways::server_env`].
    pub fn key(&self) -> Option<&KeyPair> {
        self.key.as_ref()
    }

    /// What the server's environment needs for the gateways, in order:
    /// `(name, None)` to remove a variable, `(name, Some(value))` to set
    /// one. With gateways: every AWS credential variable removed (the
    /// operator's real credentials stay with the gateways, and boto3's
    /// default chain in LMCache finds nothing else), then
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` set to the per-launch
    /// key. Without gateways: nothing, since an `s3` tier without
    /// `s3_bucket` may rely on the operator's variables.
    ///
    /// The values are secret: set them on the server's command, never
    /// print them (`docs/s3-gateway.md`, "The per-launch key").
    pub fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        let Some(key) = self.key() else {
            return Vec::new();
        };
        server_env_removed()
            .map(|name| (name, None))
            .chain([
                ("AWS_ACCESS_KEY_ID", Some(key.access_key_id.clone())),
                ("AWS_SECRET_ACCESS_KEY", Some(key.secret_access_key.clone())),
            ])
            .collect()
    }
}

/// The longest a stop waits for the bucket bounds to release their leases
/// ([`bound::Bound::release`]) before the gateways stop regardless.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for Gateways {
    /// Releases every bucket bound's lease at once (within 3 s in all, on
    /// a thread of its own, so that a drop inside an async caller does not
    /// block its runtime's thread on this one; a slow store behind one
    /// tier does not hold up another's release), then stops the runtime
    /// without waiting for its tasks.
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let bounds = std::mem::take(&mut self.bounds);
        if !bounds.is_empty() {
            let handle = runtime.handle().clone();
            let release = async move {
                let all = futures_util::future::join_all(bounds.iter().map(|b| b.release()));
                let _ = tokio::time::timeout(RELEASE_WAIT, all).await;
            };
            let _ = std::thread::spawn(move || handle.block_on(release)).join();
        }
        runtime.shutdown_background();
    }
}

/// A gateway that listens ([`start_one`]).
struct Started {
    addr: SocketAddr,
    /// The source of the credentials the start-up check used.
    source: String,
    stats: Arc<Stats>,
    /// Its bucket bound, if the tier has one.
    bound: Option<Arc<bound::Bound>>,
}

/// Checks the tier's bucket and starts its gateway; returns where it
/// listens, the source of the credentials the start-up check used (also
/// in the gateway's state, [`state::GatewayState::credential_source`]), its
/// counters and its bound. A start that fails after the bound started
/// releases the bound's lease first ([`bound::Bound::release`]).
/// Only connections whose socket belongs to `server_uid` are served
/// ([`peer`]). With a `bound`, the gateway checks that it may list the
/// tier's prefix before it listens, then lists it in the background and
/// keeps the bucket within the bound ([`bound`]).
async fn start_one(
    tier: BucketTier,
    bound: Option<(bound::BoundSpec, Vec<String>)>,
    node_file: Option<PathBuf>,
    key: KeyPair,
    server_uid: u32,
) -> Result<Started, GatewayError> {
    let stats = Stats::new(&tier);
    let (mut upstream, source) = gateway::Upstream::connect(tier, key).await?;
    let stats = Arc::new(stats.with_credential_source(&source));
    if let Some((spec, models)) = bound {
        let (tier, credentials) = upstream.tier_and_credentials();
        let models = fleet::models::Models::new(models);
        let position = tier.position;
        let claimed =
            tokio::task::spawn_blocking(move || node_id::claim(node_file.as_deref(), position));
        let node = claimed.await.map_err(std::io::Error::other)?;
        let started = bound::start(tier, credentials, spec, models, node, stats.clone()).await?;
        upstream.bound = Some(started);
    }
    let upstream = Arc::new(upstream);
    upstream.note_credential_expiry(&stats).await;
    let (listener, addr) = match gateway::bind().await {
        Ok(bound) => bound,
        Err(e) => {
            if let Some(bound) = &upstream.bound {
                bound.release().await;
            }
            return Err(e.into());
        }
    };
    let peers = gateway::Peers { server_uid, addr };
    tokio::spawn(gateway::serve(
        listener,
        peers,
        upstream.clone(),
        stats.clone(),
    ));
    let bound = upstream.bound.clone();
    tokio::spawn(keep_credentials_fresh(upstream, stats.clone()));
    Ok(Started {
        addr,
        source,
        stats,
        bound,
    })
}

/// How often an idle gateway looks at its credentials.
const CREDENTIAL_CHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Looks at the real credentials every [`CREDENTIAL_CHECK`], so that
/// temporary ones are refreshed ([`credentials::REFRESH_BEFORE`] before
/// they expire) and their expiry in `stats` stays current while LMCache
/// sends nothing; a refresh that fails shows as an expiry that comes
/// closer (`docs/metrics.md`).
async fn keep_credentials_fresh(upstream: Arc<gateway::Upstream>, stats: Arc<Stats>) {
    loop {
        tokio::time::sleep(CREDENTIAL_CHECK).await;
        upstream.note_credential_expiry(&stats).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lmcache_tier_e2e::answering_store;

    #[tokio::test(flavor = "current_thread")]
    async fn arguments_without_bucket_tiers_pass_through_untouched() {
        let args: Vec<String> = [
            "server",
            "--l2-adapter",
            r#"{"type":"s3","s3_endpoint":"b.h","s3_region":"r"}"#,
            "--l2-adapter={\"type\":\"fs\",\"base_path\":\"/x\"}",
            "--port",
            "1",
        ]
        .map(String::from)
        .to_vec();
        let (out, gateways) = Gateways::start_args(&args, &|_| None, None).await.unwrap();
        assert_eq!(out, args);
        assert!(gateways.addresses().is_empty());
        assert!(gateways.server_env().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_bad_bucket_tier_fails_before_anything_starts() {
        let args: Vec<String> = [
            "bench",
            "l2",
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/x"}"#,
            "--l2-adapter",
            r#"{"type":"s3","s3_endpoint":"127.0.0.1:1","s3_bucket":"kvc","aws_access_key_id":"A","aws_secret_access_key":"S"}"#,
        ]
        .map(String::from)
        .to_vec();
        let e = Gateways::start_args(&args, &|_| None, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("L2 tier 1 (s3): s3_region: is missing"),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_unreachable_endpoint_is_an_error_naming_the_tier() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let args = vec![
            "--l2-adapter".to_string(),
            format!(
                r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{port}","s3_bucket":"kvc","s3_region":"r","disable_tls":true,"aws_access_key_id":"A","aws_secret_access_key":"S"}}"#
            ),
        ];
        let e = Gateways::start_args(&args, &|_| None, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("L2 tier 0 (s3): s3_endpoint: HEAD http://127.0.0.1:"),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_tier_without_credentials_fails_naming_the_sources_tried() {
        let home = tempfile::tempdir().unwrap();
        let home_path = home.path().display().to_string();
        let env = |k: &str| match k {
            "HOME" => Some(home_path.clone()),
            "AWS_EC2_METADATA_DISABLED" => Some("true".to_string()),
            _ => None,
        };
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(
            home.path().join(".aws/config"),
            "[profile other]\nregion = r\n",
        )
        .unwrap();
        let args = vec![
            "--l2-adapter".to_string(),
            r#"{"type":"s3","s3_endpoint":"127.0.0.1:1","s3_bucket":"kvc","s3_region":"r","disable_tls":true}"#.to_string(),
        ];
        let e = Gateways::start_args(&args, &env, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "L2 tier 0 (s3): aws_access_key_id: no credentials: the tier has no aws_access_key_id, AWS_ACCESS_KEY_ID is not set, and the AWS default chain found none; tried: profile \"default\" in {home_path}/.aws/config. Set "
            )),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_fifo_as_web_identity_token_stops_the_start_naming_the_tier_and_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("token");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let token = fifo.display().to_string();
        let env = |k: &str| match k {
            "HOME" => Some(dir.path().display().to_string()),
            "AWS_EC2_METADATA_DISABLED" => Some("true".to_string()),
            "AWS_WEB_IDENTITY_TOKEN_FILE" => Some(token.clone()),
            "AWS_ROLE_ARN" => Some("arn:aws:iam::1:role/r".to_string()),
            _ => None,
        };
        let args = vec![
            "--l2-adapter".to_string(),
            r#"{"type":"s3","s3_endpoint":"127.0.0.1:1","s3_bucket":"kvc","s3_region":"r","disable_tls":true}"#.to_string(),
        ];
        let e = tokio::time::timeout(
            Duration::from_secs(10),
            Gateways::start_args(&args, &env, None),
        )
        .await
        .expect("the start-up hung on the FIFO")
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(&format!(
                "L2 tier 0 (s3): aws_access_key_id: web identity (role arn:aws:iam::1:role/r, token {token}) failed: "
            )) && e.contains(&format!("AWS_WEB_IDENTITY_TOKEN_FILE is {fifo:?}, which is not a regular file")),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_state_route_answers_unsigned_counts_requests_and_holds_no_secret() {
        let port = answering_store("200 OK");
        let args = vec![
            "--l2-adapter".to_string(),
            format!(
                r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{port}","s3_bucket":"kvc","s3_key_prefix":"p/","s3_region":"r","disable_tls":true,"aws_access_key_id":"AKIATOPSECRETID","aws_secret_access_key":"TOPSECRET"}}"#
            ),
        ];
        let (_, gateways) = Gateways::start_args(&args, &|_| None, None).await.unwrap();
        let (_, addr) = gateways.addresses()[0];
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let refused = client
            .put(format!("http://{addr}/m%40x"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), 403);
        let timeout = std::time::Duration::from_secs(10);
        let state = state::fetch(addr, timeout)
            .await
            .unwrap()
            .expect("the state");
        assert_eq!(
            (state.tier, state.bucket.as_str(), state.key_prefix.as_str()),
            (0, "kvc", "p/")
        );
        assert_eq!(state.upstream, format!("http://127.0.0.1:{port}"));
        assert_eq!(state.credential_source, "the tier's aws_access_key_id");
        assert_eq!(
            (state.requests.put, state.rejected),
            (0, 1),
            "a request refused at the signature check is not a PUT served"
        );
        assert_eq!(state.upstream_unreachable + state.upstream_errors, 0);
        let raw = client
            .get(format!("http://{addr}{}", state::STATE_PATH))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !raw.contains("TOPSECRET") && !raw.contains("AKIATOPSECRETID"),
            "{raw}"
        );
        let elsewhere = answering_store("404 Not Found");
        let not_ours = SocketAddr::from(([127, 0, 0, 1], elsewhere));
        assert_eq!(state::fetch(not_ours, timeout).await, Ok(None));
        drop(gateways);
        let stopped = state::fetch(addr, timeout).await.unwrap_err().to_string();
        assert!(stopped.contains("onnect"), "{stopped}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_start_up_head_names_refused_credentials_and_a_missing_bucket() {
        for (status, key, problem) in [
            (
                "403 Forbidden",
                "aws_access_key_id",
                "refused the credentials",
            ),
            ("404 Not Found", "s3_bucket", "does not exist"),
        ] {
            let port = answering_store(status);
            let args = vec![
                "--l2-adapter".to_string(),
                format!(
                    r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{port}","s3_bucket":"kvc","s3_region":"r","disable_tls":true,"aws_access_key_id":"A","aws_secret_access_key":"TOPSECRET"}}"#
                ),
            ];
            let e = Gateways::start_args(&args, &|_| None, None)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("L2 tier 0 (s3): {key}: ")), "{e}");
            assert!(e.contains(problem), "{e}");
            assert!(!e.contains("TOPSECRET"), "{e}");
        }
    }
}
