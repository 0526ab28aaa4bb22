//! The real credentials an `s3_bucket` gateway signs upstream requests with
//! (issue 5): static keys from the tier's spec, else from the launcher's
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
//! their expiry, so every request is signed with current ones.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use aws_config::imds::credentials::ImdsCredentialsProvider;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_config::Region;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_smithy_http_client::tls;

use super::spec::KeyPair;

/// How long before their expiry temporary credentials are fetched again
/// (web identity credentials last an hour by default, instance metadata ones
/// about six; a signed request is checked by the store when it arrives).
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);

/// The shortest time between two fetches from the chain: a source that
/// hands out credentials already inside [`REFRESH_BEFORE`], or one that
/// fails, is not asked again for every request.
const MIN_REFETCH: Duration = Duration::from_secs(10);

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
    /// The shared config file: `AWS_CONFIG_FILE`, else `$HOME/.aws/config`;
    /// `None` when that file does not exist.
    pub config_file: Option<PathBuf>,
    /// The shared credentials file: `AWS_SHARED_CREDENTIALS_FILE`, else
    /// `$HOME/.aws/credentials`; `None` when that file does not exist.
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
        let file = |override_var: &str, default: &str| {
            var(override_var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(default)))
                .filter(|p| p.is_file())
        };
        let web_identity = match (var("AWS_WEB_IDENTITY_TOKEN_FILE"), var("AWS_ROLE_ARN")) {
            (Some(token_file), Some(role_arn)) => Some(WebIdentity {
                token_file: token_file.into(),
                role_arn,
                session_name: var("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "lmcache-tier".into()),
            }),
            _ => None,
        };
        let imds_disabled =
            var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        ChainSettings {
            profile: var("AWS_PROFILE").unwrap_or_else(|| "default".into()),
            config_file: file("AWS_CONFIG_FILE", ".aws/config"),
            credentials_file: file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
            web_identity,
            ecs: var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
                || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some(),
            imds: (!imds_disabled).then(|| var("AWS_EC2_METADATA_SERVICE_ENDPOINT")),
            sts_region: var("AWS_REGION")
                .or_else(|| var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| s3_region.to_string()),
        }
    }

    /// The sources this chain tries, in order, each with what it reads.
    fn sources(&self) -> Result<Vec<(String, SharedCredentialsProvider)>, String> {
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
            sources.push((
                format!("profile {:?} in {}", self.profile, names.join(" and ")),
                SharedCredentialsProvider::new(provider),
            ));
        }
        if let Some(w) = &self.web_identity {
            let provider = WebIdentityTokenCredentialsProvider::builder()
                .configure(&conf)
                .static_configuration(StaticConfiguration {
                    web_identity_token_file: w.token_file.clone(),
                    role_arn: w.role_arn.clone(),
                    session_name: w.session_name.clone(),
                })
                .build();
            sources.push((
                format!(
                    "web identity (role {}, token {})",
                    w.role_arn,
                    w.token_file.display()
                ),
                SharedCredentialsProvider::new(provider),
            ));
        }
        if self.ecs {
            let provider = aws_config::ecs::EcsCredentialsProvider::builder()
                .configure(&conf)
                .build();
            sources.push((
                "the ECS container endpoint".to_string(),
                SharedCredentialsProvider::new(provider),
            ));
        }
        if let Some(endpoint) = &self.imds {
            let mut client = aws_config::imds::Client::builder().configure(&conf);
            if let Some(endpoint) = endpoint {
                client = client.endpoint(endpoint).map_err(|e| {
                    format!("AWS_EC2_METADATA_SERVICE_ENDPOINT {endpoint:?} is not a URL: {e}")
                })?;
            }
            let provider = ImdsCredentialsProvider::builder()
                .configure(&conf)
                .imds_client(client.build())
                .build();
            sources.push((
                format!(
                    "EC2 instance metadata at {}",
                    endpoint.as_deref().unwrap_or("the default endpoint")
                ),
                SharedCredentialsProvider::new(provider),
            ));
        }
        Ok(sources)
    }
}

/// Why no credentials could be had.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NoCredentials {
    /// Every source of the chain was tried and none had credentials.
    #[error("no credentials: the tier has no aws_access_key_id, AWS_ACCESS_KEY_ID is not set, and the AWS default chain found none; tried: {0}")]
    NotFound(String),
    /// A source that is set up failed (a bad profile, a refused role, an
    /// unreachable STS).
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
pub(crate) struct RealCredentials {
    sources: Vec<(String, SharedCredentialsProvider)>,
    cached: tokio::sync::Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    /// The last credentials fetched, and the index of their source.
    current: Option<(Credentials, usize)>,
    /// No fetch before this (see [`MIN_REFETCH`]).
    next_fetch: Option<Instant>,
    /// Why the last fetch failed, if it did.
    last_error: Option<NoCredentials>,
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
            vec![(
                name.to_string(),
                SharedCredentialsProvider::new(credentials),
            )]
        };
        let sources = match source {
            CredentialSource::Spec(key) => fixed("the tier's aws_access_key_id", key),
            CredentialSource::Environment(key) => fixed("AWS_ACCESS_KEY_ID", key),
            CredentialSource::Chain(settings) => {
                settings.sources().map_err(NoCredentials::Setup)?
            }
        };
        Ok(RealCredentials {
            sources,
            cached: tokio::sync::Mutex::new(Cached::default()),
        })
    }

    /// Current credentials and the name of the source they came from.
    ///
    /// Fetches from the sources in order (the first that has credentials
    /// wins) when none are cached or the cached ones expire within
    /// [`REFRESH_BEFORE`], at most every [`MIN_REFETCH`]. When a refresh
    /// fails, credentials that have not expired yet are used (and the
    /// failure is logged); otherwise the error says which sources were
    /// tried or which one failed (until the next fetch, the same error is
    /// returned at once).
    pub(crate) async fn current(&self) -> Result<(Credentials, &str), NoCredentials> {
        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        let fresh = |c: &Credentials| {
            c.expiry()
                .is_none_or(|expiry| now + REFRESH_BEFORE < expiry)
        };
        let usable = |c: &Credentials| c.expiry().is_none_or(|expiry| now < expiry);
        let may_fetch = cached.next_fetch.is_none_or(|t| Instant::now() >= t);
        if let Some((credentials, source)) = &cached.current {
            if fresh(credentials) || (!may_fetch && usable(credentials)) {
                return Ok((credentials.clone(), &self.sources[*source].0));
            }
        }
        if let (false, Some(e)) = (may_fetch, &cached.last_error) {
            return Err(e.clone());
        }
        cached.next_fetch = Some(Instant::now() + MIN_REFETCH);
        let fetched = self.fetch().await;
        cached.last_error = fetched.as_ref().err().cloned();
        match fetched {
            Ok((credentials, source)) => {
                cached.current = Some((credentials.clone(), source));
                Ok((credentials, &self.sources[source].0))
            }
            Err(e) => match &cached.current {
                Some((credentials, source)) if usable(credentials) => {
                    tracing::warn!(
                        "cannot refresh the S3 credentials from {}, using the current ones until they expire: {e}",
                        self.sources[*source].0
                    );
                    Ok((credentials.clone(), &self.sources[*source].0))
                }
                _ => Err(e),
            },
        }
    }

    /// Asks each source in order. A source without credentials
    /// (`CredentialsNotLoaded`) passes to the next, as in `aws-config`'s
    /// default chain; any other error stops the search. Returns the
    /// credentials and the index of the source.
    async fn fetch(&self) -> Result<(Credentials, usize), NoCredentials> {
        let mut tried = Vec::new();
        for (index, (name, provider)) in self.sources.iter().enumerate() {
            match provider.provide_credentials().await {
                Ok(credentials) => return Ok((credentials, index)),
                Err(e @ CredentialsError::CredentialsNotLoaded(_)) => {
                    tried.push(match std::error::Error::source(&e) {
                        Some(reason) => format!("{name} ({})", error_chain(reason)),
                        None => name.clone(),
                    });
                }
                Err(e) => {
                    return Err(NoCredentials::Failed {
                        source_name: name.clone(),
                        detail: error_chain(&e),
                    })
                }
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

/// An error with its sources, e.g. "the credential provider was not enabled: ...".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use aws_credential_types::credential_fn::provide_credentials_fn;

    use super::*;
    use crate::s3::spec::BucketTier;
    use crate::Cascade;

    const NO_KEYS: &str = r#"{"type":"s3","s3_endpoint":"h:9000","s3_bucket":"bkt","s3_region":"eu-west-3","disable_tls":true}"#;
    const SPEC_KEYS: &str = r#"{"type":"s3","s3_endpoint":"h:9000","s3_bucket":"bkt","s3_region":"eu-west-3","disable_tls":true,"aws_access_key_id":"AKSPEC","aws_secret_access_key":"SPECSECRET"}"#;

    /// A profile `tier` in a credentials file and a config file in `dir`
    /// (plus a `default` profile that must not be picked), and the
    /// environment naming them; IMDS off, so nothing leaves the machine.
    fn profile_env(dir: &std::path::Path) -> HashMap<String, String> {
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

    fn source(json: &str, env: &HashMap<String, String>) -> CredentialSource {
        let spec = Cascade::parse(json, "V").unwrap().tiers()[0].clone();
        BucketTier::from_spec(&spec, 0, &|k| env.get(k).cloned())
            .unwrap()
            .unwrap()
            .credentials
    }

    async fn resolve(source: &CredentialSource) -> Result<(String, String), NoCredentials> {
        let real = RealCredentials::new(source)?;
        let (credentials, name) = real.current().await?;
        Ok((credentials.access_key_id().to_string(), name.to_string()))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn spec_keys_beat_the_environment_which_beats_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.insert("AWS_ACCESS_KEY_ID".into(), "AKENV".into());
        env.insert("AWS_SECRET_ACCESS_KEY".into(), "ENVSECRET".into());

        let spec = source(SPEC_KEYS, &env);
        assert!(matches!(spec, CredentialSource::Spec(_)), "{spec:?}");
        assert!(!format!("{spec:?}").contains("SPECSECRET"));
        let (id, from) = resolve(&spec).await.unwrap();
        assert_eq!(
            (id.as_str(), from.as_str()),
            ("AKSPEC", "the tier's aws_access_key_id")
        );

        let environment = source(NO_KEYS, &env);
        assert!(!format!("{environment:?}").contains("ENVSECRET"));
        let (id, from) = resolve(&environment).await.unwrap();
        assert_eq!((id.as_str(), from.as_str()), ("AKENV", "AWS_ACCESS_KEY_ID"));

        env.remove("AWS_ACCESS_KEY_ID");
        env.remove("AWS_SECRET_ACCESS_KEY");
        let chain = source(NO_KEYS, &env);
        let (id, from) = resolve(&chain).await.unwrap();
        // The credentials file wins over the config file for one profile.
        assert_eq!(id, "AKPROFILE");
        assert!(from.starts_with("profile \"tier\" in "), "{from}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_profile_comes_from_aws_profile_and_may_live_in_the_config_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.insert("AWS_PROFILE".into(), "only-config".into());
        let (id, _) = resolve(&source(NO_KEYS, &env)).await.unwrap();
        assert_eq!(id, "AKONLYCONFIG");
        env.remove("AWS_PROFILE");
        let (id, from) = resolve(&source(NO_KEYS, &env)).await.unwrap();
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
        let mut env = profile_env(dir.path());
        env.insert("AWS_PROFILE".into(), "absent".into());
        let e = resolve(&source(NO_KEYS, &env)).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, NoCredentials::NotFound(_)), "{text}");
        assert!(
            text.contains("found none; tried: profile \"absent\" in "),
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
        let real = RealCredentials {
            sources: vec![("test".into(), SharedCredentialsProvider::new(provider))],
            cached: tokio::sync::Mutex::new(Cached::default()),
        };
        (real, calls)
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
        real.cached.lock().await.next_fetch = None;
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_refresh_keeps_unexpired_credentials_and_fails_without_them() {
        let (real, _) = counting(REFRESH_BEFORE - Duration::from_secs(60), 2);
        assert_eq!(real.current().await.unwrap().0.access_key_id(), "AKTEMP1");
        real.cached.lock().await.next_fetch = None;
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
        real.cached.lock().await.next_fetch = None;
        assert_eq!(real.current().await.unwrap_err(), failed);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
