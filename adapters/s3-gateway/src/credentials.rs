//! The real credentials an `s3_bucket` gateway signs upstream requests with:
//! static keys from the tier's spec, else from the launcher's
//! environment, else the rest of the AWS default chain as `aws-config`
//! implements it: profile files, web identity, ECS container, EC2 instance
//! metadata (`docs/s3-gateway.md`, "Credentials").
//!
//! What selects a source is read from the environment lookup the caller
//! passes (a map in a library user, the process environment in our
//! binaries). Two things `aws-config` only reads from the real process
//! environment: the ECS container variables once the lookup names an ECS
//! endpoint, and endpoint overrides of the STS client
//! (`AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`).
//!
//! Temporary credentials are cached and fetched again [`REFRESH_BEFORE`]
//! their expiry, so every request is signed with current ones. The refresh
//! runs in the background while the cached ones last, and every source
//! answers within [`FETCH_TIMEOUT`] or fails.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_config::imds::credentials::ImdsCredentialsProvider;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_config::Region;
use aws_credential_types::credential_fn::provide_credentials_fn;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_smithy_http_client::tls;

use super::sigv4::KeyPair;
use lmcache_tier_spec::error_chain;

/// How long before their expiry temporary credentials are fetched again
/// (web identity credentials last an hour by default, instance metadata ones
/// about six; a signed request is checked by the store when it arrives).
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);

/// The shortest time between two fetches from the chain: a source that
/// hands out credentials already inside [`REFRESH_BEFORE`], or one that
/// fails, is not asked again for every request.
const MIN_REFETCH: Duration = Duration::from_secs(10);

/// The time limit of one source's answer: a source that hangs (an STS that
/// never answers) fails with its name instead of holding up the start or
/// the refresh.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a tier's real credentials come from, in the order they are looked
/// for. `Debug` never prints a secret.
#[derive(Debug, Clone)]
pub enum CredentialSource {
    /// `aws_access_key_id`, `aws_secret_access_key` (and
    /// `aws_session_token`) in the tier's spec.
    Spec(KeyPair),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`)
    /// from the environment lookup.
    Environment(KeyPair),
    /// The rest of the AWS default chain, set up from the environment lookup.
    Chain(ChainSettings),
}

/// The AWS default chain after the environment variables: which sources
/// are tried, from the environment lookup (variable names as in the AWS
/// SDKs and CLI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSettings {
    /// The profile: `AWS_PROFILE`, else `default`.
    pub profile: String,
    /// Whether `AWS_PROFILE` names the profile: then it must have
    /// credentials (as in the AWS CLI), instead of passing to the next source.
    pub profile_required: bool,
    /// The shared config file: `AWS_CONFIG_FILE`, else `$HOME/.aws/config`;
    /// `None` when the default file does not exist.
    pub config_file: Option<PathBuf>,
    /// The shared credentials file: `AWS_SHARED_CREDENTIALS_FILE`, else
    /// `$HOME/.aws/credentials`; `None` when the default file does not exist.
    pub credentials_file: Option<PathBuf>,
    /// Web identity: `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` (both
    /// needed), `AWS_ROLE_SESSION_NAME` (else `lmcache-tier`).
    pub web_identity: Option<WebIdentity>,
    /// Whether `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or
    /// `AWS_CONTAINER_CREDENTIALS_FULL_URI` is set: the ECS container
    /// endpoint is tried (`aws-config` reads those variables, and
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`, from the process).
    pub ecs: bool,
    /// EC2 instance metadata: `None` when `AWS_EC2_METADATA_DISABLED` is
    /// `true`; else the endpoint from `AWS_EC2_METADATA_SERVICE_ENDPOINT`
    /// (`Some(None)`: `aws-config`'s default, `http://169.254.169.254`).
    pub imds: Option<Option<String>>,
    /// The region of the STS calls (web identity, roles in profiles):
    /// `AWS_REGION`, else `AWS_DEFAULT_REGION`, else the tier's `s3_region`.
    pub sts_region: String,
    /// Why the environment cannot be used as it is (a variable naming a
    /// missing file, half of the web identity variables, an endpoint that is
    /// not a URL), with what to do; the chain is not set up then.
    pub problem: Option<String>,
}

/// A web identity role to assume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebIdentity {
    /// The file holding the token (re-read at every refresh).
    pub token_file: PathBuf,
    /// The role to assume.
    pub role_arn: String,
    /// The session name.
    pub session_name: String,
}

/// The credential variables of the AWS default chain. The LMCache process
/// does not get them when every `s3` tier goes through a gateway.
pub const CREDENTIAL_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
];

impl ChainSettings {
    /// The chain's settings from the environment lookup `env`; `s3_region`
    /// is the STS region when the environment names none.
    pub fn from_env(env: &(dyn Fn(&str) -> Option<String> + Sync), s3_region: &str) -> Self {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from);
        let mut problems = Vec::new();
        let mut file = |override_var: &str, default: &str| match var(override_var) {
            Some(path) => {
                let path = PathBuf::from(path);
                if let Err(why) = regular_file(&path) {
                    problems.push(format!(
                        "{override_var} is {path:?}, which {why}. Point it at the file, or unset {override_var}."
                    ));
                    return None;
                }
                Some(path)
            }
            None => home
                .as_ref()
                .map(|h| h.join(default))
                .filter(|p| p.is_file()),
        };
        let config_file = file("AWS_CONFIG_FILE", ".aws/config");
        let credentials_file = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
        let profile = var("AWS_PROFILE");
        if let (Some(profile), None, None, true) = (
            &profile,
            &config_file,
            &credentials_file,
            problems.is_empty(),
        ) {
            problems.push(format!(
                "AWS_PROFILE is {profile:?}, but there is no profile file (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE, ~/.aws/config, ~/.aws/credentials). Define the profile in one, or unset AWS_PROFILE."
            ));
        }
        let web_identity = match (var("AWS_WEB_IDENTITY_TOKEN_FILE"), var("AWS_ROLE_ARN")) {
            (Some(token_file), Some(role_arn)) => Some(WebIdentity {
                token_file: token_file.into(),
                role_arn,
                session_name: var("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "lmcache-tier".into()),
            }),
            (Some(_), None) => {
                problems.push("AWS_WEB_IDENTITY_TOKEN_FILE is set without AWS_ROLE_ARN. Set AWS_ROLE_ARN to the role to assume, or unset AWS_WEB_IDENTITY_TOKEN_FILE.".into());
                None
            }
            (None, Some(_)) => {
                problems.push("AWS_ROLE_ARN is set without AWS_WEB_IDENTITY_TOKEN_FILE. Set AWS_WEB_IDENTITY_TOKEN_FILE to the web identity token file, or unset AWS_ROLE_ARN.".into());
                None
            }
            (None, None) => None,
        };
        let imds_disabled =
            var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let imds_endpoint = var("AWS_EC2_METADATA_SERVICE_ENDPOINT");
        if let (false, Some(endpoint)) = (imds_disabled, &imds_endpoint) {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                problems.push(format!(
                    "AWS_EC2_METADATA_SERVICE_ENDPOINT {endpoint:?} is not a URL (no http:// or https://). Set it to e.g. http://169.254.169.254, or unset it."
                ));
            }
        }
        ChainSettings {
            profile_required: profile.is_some(),
            profile: profile.unwrap_or_else(|| "default".into()),
            config_file,
            credentials_file,
            web_identity,
            ecs: var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
                || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some(),
            imds: (!imds_disabled).then_some(imds_endpoint),
            sts_region: var("AWS_REGION")
                .or_else(|| var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| s3_region.to_string()),
            problem: (!problems.is_empty()).then(|| problems.join(" ")),
        }
    }

    /// The sources this chain tries, in order, each with what it reads.
    ///
    /// # Errors
    /// [`NoCredentials::Setup`]: the environment's problems.
    fn sources(&self) -> Result<Vec<Source>, NoCredentials> {
        if let Some(problem) = &self.problem {
            return Err(NoCredentials::Setup(problem.clone()));
        }
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let conf = ProviderConfig::without_region()
            .with_http_client(http_client)
            .with_region(Some(Region::new(self.sts_region.clone())));
        let mut sources = Vec::new();
        let mut files = EnvConfigFiles::builder()
            .include_default_config_file(false)
            .include_default_credentials_file(false);
        let mut names = Vec::new();
        for (kind, path) in [
            (EnvConfigFileKind::Config, &self.config_file),
            (EnvConfigFileKind::Credentials, &self.credentials_file),
        ] {
            if let Some(path) = path {
                files = files.with_file(kind, path);
                names.push(path.display().to_string());
            }
        }
        if !names.is_empty() {
            let provider = ProfileFileCredentialsProvider::builder()
                .configure(&conf)
                .profile_files(files.build())
                .profile_name(&self.profile)
                .build();
            sources.push(Source {
                name: format!("profile {:?} in {}", self.profile, names.join(" and ")),
                provider: SharedCredentialsProvider::new(provider),
                required_by: self.profile_required.then_some("AWS_PROFILE"),
            });
        }
        if let Some(w) = &self.web_identity {
            let provider = SharedCredentialsProvider::new(
                WebIdentityTokenCredentialsProvider::builder()
                    .configure(&conf)
                    .static_configuration(StaticConfiguration {
                        web_identity_token_file: w.token_file.clone(),
                        role_arn: w.role_arn.clone(),
                        session_name: w.session_name.clone(),
                    })
                    .build(),
            );
            let token_file = w.token_file.clone();
            // aws-config reads the token file without a time limit: a FIFO
            // there would block the refresh for good.
            let checked = provide_credentials_fn(move || {
                let provider = provider.clone();
                let token_file = token_file.clone();
                async move {
                    regular_file(&token_file).map_err(|why| {
                        CredentialsError::invalid_configuration(format!(
                            "AWS_WEB_IDENTITY_TOKEN_FILE is {token_file:?}, which {why}. Point it at the token file"
                        ))
                    })?;
                    provider.provide_credentials().await
                }
            });
            sources.push(Source {
                name: format!(
                    "web identity (role {}, token {})",
                    w.role_arn,
                    w.token_file.display()
                ),
                provider: SharedCredentialsProvider::new(checked),
                required_by: None,
            });
        }
        if self.ecs {
            let provider = aws_config::ecs::EcsCredentialsProvider::builder()
                .configure(&conf)
                .build();
            sources.push(Source {
                name: "the ECS container endpoint".to_string(),
                provider: SharedCredentialsProvider::new(provider),
                required_by: None,
            });
        }
        if let Some(endpoint) = &self.imds {
            let mut client = aws_config::imds::Client::builder().configure(&conf);
            if let Some(endpoint) = endpoint {
                client = client.endpoint(endpoint).map_err(|e| {
                    NoCredentials::Setup(format!(
                        "AWS_EC2_METADATA_SERVICE_ENDPOINT {endpoint:?} is not a URL: {e}"
                    ))
                })?;
            }
            let provider = ImdsCredentialsProvider::builder()
                .configure(&conf)
                .imds_client(client.build())
                .build();
            sources.push(Source {
                name: format!(
                    "EC2 instance metadata at {}",
                    endpoint.as_deref().unwrap_or("the default endpoint")
                ),
                provider: SharedCredentialsProvider::new(provider),
                required_by: None,
            });
        }
        Ok(sources)
    }
}

/// Why a file a variable names cannot be read ([`regular_file`]); the
/// message follows "which".
#[derive(Debug, thiserror::Error)]
enum NotRegularFile {
    /// Something else is there: a directory, a FIFO, a socket, ...
    #[error("is not a regular file")]
    Other,
    /// Nothing is there.
    #[error("does not exist")]
    Missing,
    /// Its metadata cannot be read.
    #[error("cannot be read: {0}")]
    Unreadable(
        /// The `stat` error.
        #[source]
        std::io::Error,
    ),
}

/// Whether `path` is a regular file (after symbolic links); else why not.
fn regular_file(path: &Path) -> Result<(), NotRegularFile> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(NotRegularFile::Other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NotRegularFile::Missing),
        Err(e) => Err(NotRegularFile::Unreadable(e)),
    }
}

/// One source of the chain.
struct Source {
    /// What it reads, e.g. `profile "kv" in /root/.aws/credentials`.
    name: String,
    provider: SharedCredentialsProvider,
    /// The variable that selected it when it must have credentials: then a
    /// source without credentials is an error naming the variable, not a
    /// pass to the next source.
    required_by: Option<&'static str>,
}

/// Why no credentials could be had.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NoCredentials {
    /// Every source of the chain was tried and none had credentials.
    #[error("no credentials: the tier has no aws_access_key_id, AWS_ACCESS_KEY_ID is not set, and the AWS default chain found none; tried: {0}")]
    NotFound(String),
    /// A source that is set up failed (a bad profile, a refused role, an
    /// unreachable STS, no answer within [`FETCH_TIMEOUT`]).
    #[error("{source_name} failed: {detail}")]
    Failed {
        /// The source, e.g. `web identity (role ...)`.
        source_name: String,
        /// The error with its causes (never a secret).
        detail: String,
    },
    /// The chain cannot be set up from the environment.
    #[error("{0}")]
    Setup(String),
}

/// A tier's credentials, fetched from its [`CredentialSource`] and cached
/// until [`REFRESH_BEFORE`] their expiry.
#[derive(Clone)]
pub(crate) struct RealCredentials {
    inner: Arc<Inner>,
}

struct Inner {
    sources: Vec<Source>,
    /// The time limit of one source's answer ([`FETCH_TIMEOUT`]).
    fetch_timeout: Duration,
    /// Never held across an await.
    cached: Mutex<Cached>,
    /// Held while fetching: one fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Cached {
    /// The last credentials fetched, and the index of their source.
    current: Option<(Credentials, usize)>,
    /// No fetch before this (see [`MIN_REFETCH`]).
    next_fetch: Option<Instant>,
    /// Why the last fetch failed, if it did.
    last_error: Option<NoCredentials>,
    /// Whether a refresh runs in the background.
    refreshing: bool,
}

/// What the cache holds for a request.
enum Lookup {
    /// Credentials to use (and the index of their source), or the error of
    /// the last fetch.
    Ready(Result<(Credentials, usize), NoCredentials>),
    /// Nothing usable: the request has to wait for a fetch.
    Fetch,
}

impl RealCredentials {
    /// The credentials of `source` (nothing is fetched yet).
    pub(crate) fn new(source: &CredentialSource) -> Result<Self, NoCredentials> {
        let fixed = |name: &str, key: &KeyPair| {
            let credentials = Credentials::new(
                &key.access_key_id,
                &key.secret_access_key,
                key.session_token.clone(),
                None,
                "lmcache-tier",
            );
            vec![Source {
                name: name.to_string(),
                provider: SharedCredentialsProvider::new(credentials),
                required_by: None,
            }]
        };
        let sources = match source {
            CredentialSource::Spec(key) => fixed("the tier's aws_access_key_id", key),
            CredentialSource::Environment(key) => fixed("AWS_ACCESS_KEY_ID", key),
            CredentialSource::Chain(settings) => settings.sources()?,
        };
        Ok(Self::with_sources(sources, FETCH_TIMEOUT))
    }

    fn with_sources(sources: Vec<Source>, fetch_timeout: Duration) -> Self {
        RealCredentials {
            inner: Arc::new(Inner {
                sources,
                fetch_timeout,
                cached: Mutex::new(Cached::default()),
                fetching: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Current credentials and the name of the source they came from.
    ///
    /// Fetches from the sources in order (the first that has credentials
    /// wins) when none are cached or the cached ones expire within
    /// [`REFRESH_BEFORE`], at most every [`MIN_REFETCH`], each source
    /// within [`FETCH_TIMEOUT`]. While the cached credentials have not
    /// expired, they are returned at once and the refresh runs in the
    /// background (one at a time); when it fails, they are used until they
    /// expire (and the failure is logged). Without usable credentials, the
    /// request waits for a fetch, and the error says which sources were
    /// tried or which one failed (until the next fetch, the same error is
    /// returned at once).
    pub(crate) async fn current(&self) -> Result<(Credentials, &str), NoCredentials> {
        let inner = &self.inner;
        let found = match inner.lookup() {
            Lookup::Ready(found) => found,
            Lookup::Fetch => {
                let _fetching = inner.fetching.lock().await;
                match inner.lookup() {
                    Lookup::Ready(found) => found,
                    Lookup::Fetch => inner.fetch_and_cache().await,
                }
            }
        };
        found.map(|(credentials, source)| (credentials, inner.sources[source].name.as_str()))
    }
}

impl Inner {
    fn cached(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the cache holds; starts a background refresh when the cached
    /// credentials are usable but due for one.
    fn lookup(self: &Arc<Self>) -> Lookup {
        let mut cached = self.cached();
        let now = SystemTime::now();
        let may_fetch = cached.next_fetch.is_none_or(|t| Instant::now() >= t);
        if let Some((credentials, source)) = &cached.current {
            let ready = Lookup::Ready(Ok((credentials.clone(), *source)));
            match credentials.expiry() {
                None => return ready,
                Some(expiry) if now + REFRESH_BEFORE < expiry => return ready,
                Some(expiry) if now < expiry => {
                    if may_fetch && !cached.refreshing {
                        cached.refreshing = true;
                        let inner = self.clone();
                        tokio::spawn(async move {
                            let fetching = inner.fetching.lock().await;
                            inner.fetch_and_cache().await.ok();
                            drop(fetching);
                            inner.cached().refreshing = false;
                        });
                    }
                    return ready;
                }
                Some(_) => {}
            }
        }
        match (may_fetch, &cached.last_error) {
            (false, Some(e)) => Lookup::Ready(Err(e.clone())),
            _ => Lookup::Fetch,
        }
    }

    /// Fetches (the caller holds `fetching`) and caches the outcome; a
    /// failure returns the cached credentials while they have not expired.
    async fn fetch_and_cache(&self) -> Result<(Credentials, usize), NoCredentials> {
        self.cached().next_fetch = Some(Instant::now() + MIN_REFETCH);
        let fetched = self.fetch().await;
        let mut cached = self.cached();
        cached.last_error = fetched.as_ref().err().cloned();
        match fetched {
            Ok((credentials, source)) => {
                cached.current = Some((credentials.clone(), source));
                Ok((credentials, source))
            }
            Err(e) => match &cached.current {
                Some((credentials, source))
                    if credentials
                        .expiry()
                        .is_none_or(|expiry| SystemTime::now() < expiry) =>
                {
                    tracing::warn!(
                        "cannot refresh the S3 credentials from {}, using the current ones until they expire: {e}",
                        self.sources[*source].name
                    );
                    Ok((credentials.clone(), *source))
                }
                _ => Err(e),
            },
        }
    }

    /// Asks each source in order, each within `fetch_timeout`. A source
    /// without credentials (`CredentialsNotLoaded`) passes to the next, as
    /// in `aws-config`'s default chain, unless it is required; any other
    /// error stops the search. Returns the credentials and the index of the
    /// source.
    async fn fetch(&self) -> Result<(Credentials, usize), NoCredentials> {
        let mut tried = Vec::new();
        for (index, source) in self.sources.iter().enumerate() {
            let failed = |detail: String| NoCredentials::Failed {
                source_name: source.name.clone(),
                detail,
            };
            let answer =
                tokio::time::timeout(self.fetch_timeout, source.provider.provide_credentials())
                    .await
                    .map_err(|_| {
                        failed(format!(
                            "no answer within {}; check that it is reachable",
                            humantime::format_duration(self.fetch_timeout)
                        ))
                    })?;
            match answer {
                Ok(credentials) => return Ok((credentials, index)),
                Err(e @ CredentialsError::CredentialsNotLoaded(_)) => {
                    let reason = std::error::Error::source(&e).map(detail);
                    if let Some(variable) = source.required_by {
                        return Err(failed(format!(
                            "{variable} names it, but it has no credentials{}. Define it, or unset {variable}",
                            reason.map(|r| format!(" ({r})")).unwrap_or_default()
                        )));
                    }
                    tried.push(match reason {
                        Some(reason) => format!("{} ({reason})", source.name),
                        None => source.name.clone(),
                    });
                }
                Err(e) => return Err(failed(detail(&e))),
            }
        }
        if tried.is_empty() {
            tried.push(
                "nothing (no profile file, no web identity, no ECS endpoint, instance metadata disabled)"
                    .into(),
            );
        }
        Err(NoCredentials::NotFound(tried.join("; ")))
    }
}

/// What an error of a source says, without what may carry a secret: the
/// stderr of a failing `credential_process` is left out; an SSO profile
/// gets what to use instead.
fn detail(e: &dyn std::error::Error) -> String {
    let text = error_chain(e);
    if text.contains("cargo feature(s) enabled: sso") {
        return "SSO profiles are not supported; use static keys, a role, credential_process or web identity".into();
    }
    match text.find(". Stderr: ") {
        Some(at) => format!(
            "{}; its stderr is not shown (it may hold a secret)",
            text[..at].replace("external process", "the profile's credential_process")
        ),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use test_support::{profile_env, resolve};

    /// What a tier without keys gets under `env`: the chain after the
    /// environment variables.
    fn chain(env: &HashMap<String, String>) -> CredentialSource {
        CredentialSource::Chain(ChainSettings::from_env(
            &|k| env.get(k).cloned(),
            "eu-west-3",
        ))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_profile_comes_from_aws_profile_and_may_live_in_the_config_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.insert("AWS_PROFILE".into(), "only-config".into());
        let (id, _) = resolve(&chain(&env)).await.unwrap();
        assert_eq!(id, "AKONLYCONFIG");
        env.remove("AWS_PROFILE");
        let (id, from) = resolve(&chain(&env)).await.unwrap();
        assert_eq!(id, "AKDEFAULT");
        assert!(from.starts_with("profile \"default\""), "{from}");
    }

    #[test]
    fn the_chain_settings_come_from_the_environment_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.remove("AWS_SHARED_CREDENTIALS_FILE");
        env.remove("AWS_EC2_METADATA_DISABLED");
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(dir.path().join(".aws/credentials"), "[tier]\n").unwrap();
        env.insert("AWS_WEB_IDENTITY_TOKEN_FILE".into(), "/run/token".into());
        env.insert("AWS_ROLE_ARN".into(), "arn:aws:iam::1:role/r".into());
        env.insert(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT".into(),
            "http://127.0.0.1:1".into(),
        );
        env.insert("AWS_DEFAULT_REGION".into(), "us-west-2".into());
        let settings = ChainSettings::from_env(&|k| env.get(k).cloned(), "eu-west-3");
        assert_eq!(
            settings,
            ChainSettings {
                profile: "tier".into(),
                profile_required: true,
                config_file: Some(dir.path().join("config")),
                credentials_file: Some(dir.path().join(".aws/credentials")),
                web_identity: Some(WebIdentity {
                    token_file: "/run/token".into(),
                    role_arn: "arn:aws:iam::1:role/r".into(),
                    session_name: "lmcache-tier".into(),
                }),
                ecs: false,
                imds: Some(Some("http://127.0.0.1:1".into())),
                sts_region: "us-west-2".into(),
                problem: None,
            }
        );
        let bare = ChainSettings::from_env(
            &|k| (k == "AWS_EC2_METADATA_DISABLED").then(|| "TRUE".to_string()),
            "eu-west-3",
        );
        assert_eq!((bare.imds, bare.sts_region.as_str()), (None, "eu-west-3"));
        assert_eq!((bare.config_file, bare.credentials_file), (None, None));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_any_source_the_error_says_what_was_tried() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(dir.path().join(".aws/config"), "[profile other]\n").unwrap();
        let env: HashMap<String, String> = [
            ("HOME", dir.path().display().to_string()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let e = resolve(&chain(&env)).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, NoCredentials::NotFound(_)), "{text}");
        assert!(
            text.contains("found none; tried: profile \"default\" in "),
            "{text}"
        );
        let nothing = ChainSettings::from_env(
            &|k| (k == "AWS_EC2_METADATA_DISABLED").then(|| "true".to_string()),
            "r",
        );
        let e = resolve(&CredentialSource::Chain(nothing))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            NoCredentials::NotFound(
                "nothing (no profile file, no web identity, no ECS endpoint, instance metadata disabled)"
                    .into()
            )
        );
    }

    /// A source handing out credentials that expire `lifetime` from now,
    /// failing from the `fail_from`-th call on; counts its calls.
    fn counting(lifetime: Duration, fail_from: usize) -> (RealCredentials, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let provider = provide_credentials_fn(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n >= fail_from {
                    return Err(CredentialsError::provider_error("STS is down"));
                }
                Ok(Credentials::new(
                    format!("AKTEMP{n}"),
                    "TEMPSECRET",
                    Some("TOKEN".into()),
                    Some(SystemTime::now() + lifetime),
                    "test",
                ))
            }
        });
        (test_credentials(provider, FETCH_TIMEOUT), calls)
    }

    /// Credentials from the one source `provider`, named `test`.
    fn test_credentials(
        provider: impl ProvideCredentials + 'static,
        fetch_timeout: Duration,
    ) -> RealCredentials {
        RealCredentials::with_sources(
            vec![Source {
                name: "test".into(),
                provider: SharedCredentialsProvider::new(provider),
                required_by: None,
            }],
            fetch_timeout,
        )
    }

    /// Lets a background refresh of `real` finish.
    async fn settle(real: &RealCredentials) {
        while real.inner.cached().refreshing {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn temporary_credentials_are_cached_and_fetched_again_before_they_expire() {
        let (real, calls) = counting(Duration::from_secs(3600), usize::MAX);
        for _ in 0..3 {
            assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // Inside REFRESH_BEFORE: fetched again once MIN_REFETCH has passed.
        let (real, calls) = counting(REFRESH_BEFORE - Duration::from_secs(60), usize::MAX);
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        real.inner.cached().next_fetch = None;
        // Refreshed in the background: the current ones until it is done.
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        settle(&real).await;
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_refresh_keeps_unexpired_credentials_and_fails_without_them() {
        let (real, _) = counting(REFRESH_BEFORE - Duration::from_secs(60), 2);
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        real.inner.cached().next_fetch = None;
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        settle(&real).await;
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");

        let (real, calls) = counting(Duration::from_secs(3600), 1);
        let failed = NoCredentials::Failed {
            source_name: "test".into(),
            detail: "an error occurred while loading credentials: STS is down".into(),
        };
        assert_eq!(real.current().await.unwrap_err(), failed);
        // Not asked again before MIN_REFETCH has passed.
        assert_eq!(real.current().await.unwrap_err(), failed);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        real.inner.cached().next_fetch = None;
        assert_eq!(real.current().await.unwrap_err(), failed);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// A source that never answers (a hung STS; the real aws-config STS
    /// client reads its endpoint override from the process environment
    /// only, so a test cannot point it at a silent loopback server).
    fn hanging() -> impl ProvideCredentials {
        provide_credentials_fn(std::future::pending)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hung_refresh_does_not_hold_up_requests_while_the_credentials_last() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let provider = provide_credentials_fn(move || {
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if !first {
                    std::future::pending::<()>().await;
                }
                Ok(Credentials::new(
                    "AKTEMP1",
                    "TEMPSECRET",
                    Some("TOKEN".into()),
                    Some(SystemTime::now() + REFRESH_BEFORE - Duration::from_secs(60)),
                    "test",
                ))
            }
        });
        let real = test_credentials(provider, Duration::from_millis(200));
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        real.inner.cached().next_fetch = None;
        for _ in 0..3 {
            let (credentials, _) = tokio::time::timeout(Duration::from_millis(100), real.current())
                .await
                .expect("a request waited on the refresh")
                .unwrap();
            assert_eq!(credentials.access_key_id(), "AKTEMP1");
        }
        // One refresh at a time; it gives up after the time limit and the
        // current credentials stay in use.
        settle(&real).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let last_error = real.inner.cached().last_error.clone().unwrap().to_string();
        assert_eq!(
            last_error,
            "test failed: no answer within 200ms; check that it is reachable"
        );
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_source_that_never_answers_fails_within_the_time_limit_naming_it() {
        let real = test_credentials(hanging(), Duration::from_millis(50));
        let e = tokio::time::timeout(Duration::from_secs(5), real.current())
            .await
            .expect("the fetch has no time limit")
            .unwrap_err();
        assert_eq!(
            e,
            NoCredentials::Failed {
                source_name: "test".into(),
                detail: "no answer within 50ms; check that it is reachable".into(),
            }
        );
    }

    /// The chain of `env` (no keys, IMDS off unless `env` says otherwise).
    async fn chain_error(env: &[(&str, String)]) -> String {
        let env: HashMap<String, String> = [("AWS_EC2_METADATA_DISABLED", "true".to_string())]
            .into_iter()
            .chain(env.iter().cloned())
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let settings = ChainSettings::from_env(&|k| env.get(k).cloned(), "r");
        let found = tokio::time::timeout(
            Duration::from_secs(10),
            resolve(&CredentialSource::Chain(settings)),
        )
        .await
        .expect("the chain hung");
        found.unwrap_err().to_string()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_web_identity_token_file_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("token");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = chain_error(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", fifo.display().to_string()),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r".into()),
        ])
        .await;
        assert!(
            e.starts_with(&format!(
                "web identity (role arn:aws:iam::1:role/r, token {}) failed: ",
                fifo.display()
            )),
            "{e}"
        );
        assert!(
            e.contains(&format!(
                "AWS_WEB_IDENTITY_TOKEN_FILE is {fifo:?}, which is not a regular file"
            )),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_profile_or_file_named_in_the_environment_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.insert("AWS_PROFILE".into(), "absent".into());
        let e = resolve(&chain(&env)).await.unwrap_err().to_string();
        assert!(
            e.starts_with("profile \"absent\" in ")
                && e.contains(" failed: AWS_PROFILE names it, but it has no credentials (")
                && e.ends_with("Define it, or unset AWS_PROFILE"),
            "{e}"
        );

        let missing = dir.path().join("missing").display().to_string();
        for variable in ["AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"] {
            let e = chain_error(&[(variable, missing.clone())]).await;
            assert_eq!(
                e,
                format!("{variable} is {missing:?}, which does not exist. Point it at the file, or unset {variable}.")
            );
        }
        let e = chain_error(&[
            ("AWS_PROFILE", "kv".into()),
            ("HOME", dir.path().join("empty").display().to_string()),
        ])
        .await;
        assert!(
            e.starts_with("AWS_PROFILE is \"kv\", but there is no profile file"),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn half_a_web_identity_and_an_endpoint_without_scheme_name_the_variable() {
        let e = chain_error(&[("AWS_ROLE_ARN", "arn:aws:iam::1:role/r".into())]).await;
        assert!(
            e.starts_with("AWS_ROLE_ARN is set without AWS_WEB_IDENTITY_TOKEN_FILE."),
            "{e}"
        );
        let e = chain_error(&[("AWS_WEB_IDENTITY_TOKEN_FILE", "/run/token".into())]).await;
        assert!(
            e.starts_with("AWS_WEB_IDENTITY_TOKEN_FILE is set without AWS_ROLE_ARN."),
            "{e}"
        );
        let e = chain_error(&[
            ("AWS_EC2_METADATA_DISABLED", "false".into()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "127.0.0.1:1234".into()),
        ])
        .await;
        assert!(
            e.starts_with(
                "AWS_EC2_METADATA_SERVICE_ENDPOINT \"127.0.0.1:1234\" is not a URL (no http:// or https://)."
            ),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sso_profiles_and_failing_credential_processes_say_what_to_do_without_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        std::fs::write(
            &config,
            "[profile sso]\nsso_start_url = https://example.awsapps.com/start\nsso_region = us-east-1\nsso_account_id = 111122223333\nsso_role_name = r\n\n[profile process]\ncredential_process = sh -c 'echo STDERRSECRET >&2; exit 3'\n",
        )
        .unwrap();
        let config = config.display().to_string();
        let e = chain_error(&[
            ("AWS_CONFIG_FILE", config.clone()),
            ("AWS_PROFILE", "sso".into()),
        ])
        .await;
        assert!(
            e.ends_with("failed: SSO profiles are not supported; use static keys, a role, credential_process or web identity"),
            "{e}"
        );
        let e = chain_error(&[
            ("AWS_CONFIG_FILE", config),
            ("AWS_PROFILE", "process".into()),
        ])
        .await;
        assert!(!e.contains("STDERRSECRET"), "{e}");
        assert!(
            e.contains("the profile's credential_process exited with code exit status: 3; its stderr is not shown"),
            "{e}"
        );
    }
}

/// Helpers the credential tests here and the spec's tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::HashMap;

    use super::{CredentialSource, NoCredentials, RealCredentials};

    /// A profile `tier` in a credentials file and a config file in `dir`
    /// (plus a `default` profile that must not be picked), and the
    /// environment naming them; IMDS off, so nothing leaves the machine.
    pub(crate) fn profile_env(dir: &std::path::Path) -> HashMap<String, String> {
        let credentials = dir.join("credentials");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = DEFAULTSECRET\n\n[tier]\naws_access_key_id = AKPROFILE\naws_secret_access_key = PROFILESECRET\n",
        )
        .unwrap();
        let config = dir.join("config");
        std::fs::write(
            &config,
            "[profile tier]\naws_access_key_id = AKCONFIG\naws_secret_access_key = CONFIGSECRET\n\n[profile only-config]\naws_access_key_id = AKONLYCONFIG\naws_secret_access_key = ONLYCONFIGSECRET\n",
        )
        .unwrap();
        [
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                credentials.display().to_string(),
            ),
            ("AWS_CONFIG_FILE", config.display().to_string()),
            ("AWS_PROFILE", "tier".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("HOME", dir.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The access key id `source` resolves to, and where it came from.
    pub(crate) async fn resolve(
        source: &CredentialSource,
    ) -> Result<(String, String), NoCredentials> {
        let real = RealCredentials::new(source)?;
        let (credentials, name) = real.current().await?;
        Ok((credentials.access_key_id().to_string(), name.to_string()))
    }
}
