//! What the gateway's integration tests share: a request to a gateway
//! signed as LMCache signs it.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use lmcache_s3_gateway::sigv4::s3_signature;

/// The gateway at `addr` (`127.0.0.1:<port>`), its per-launch key and the
/// region it signs for.
pub struct Signer<'a> {
    /// Where the gateway listens.
    pub addr: &'a str,
    /// The per-launch access key id.
    pub key_id: &'a str,
    /// The per-launch secret.
    pub secret: &'a str,
    /// The region of the signatures.
    pub region: &'a str,
}

impl Signer<'_> {
    /// `method` on `key` through the gateway, signed as LMCache signs
    /// (path-style `/<key>` with `@` escaped, unsigned payload), with
    /// `body`, on `client`: ready to send.
    pub fn request(
        &self,
        client: &reqwest::Client,
        method: &str,
        key: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::RequestBuilder {
        let credentials = Credentials::new(self.key_id, self.secret, None, None, "test");
        let url = format!("http://{}/{}", self.addr, key.replace('@', "%40"));
        let signature = s3_signature(
            method,
            &url,
            &[("host", self.addr)],
            "UNSIGNED-PAYLOAD",
            &credentials,
            self.region,
            SystemTime::now(),
        )
        .expect("a SigV4 signature of the test's request");
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut request = client.request(method, &url).body(body);
        for (name, value) in signature {
            request = request.header(name, value);
        }
        request
    }
}
