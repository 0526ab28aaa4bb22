"""One GET through the s3_bucket gateway with LMCache's own S3 client.

awscrt's S3Client set up as LMCache 0.5.6's S3L2Adapter sets it up (plain
http, static credentials, default retries and throughput monitoring),
timed from the request to the error it reports. Run by
adapters/s3-gateway/benches/gateway_faults.rs with a Python that has awscrt (LMCache's
virtual environment).

Arguments: the gateway's host:port, its per-launch key id and secret, and
the object's path (percent-encoded, without the leading /).
"""

import sys
import time

from awscrt import auth, io, s3
from awscrt.http import HttpHeaders, HttpRequest


def main() -> None:
    endpoint, key_id, secret, path = sys.argv[1:5]
    event_loops = io.EventLoopGroup(1)
    bootstrap = io.ClientBootstrap(event_loops, io.DefaultHostResolver(event_loops))
    credentials = auth.AwsCredentialsProvider.new_static(key_id, secret)
    client = s3.S3Client(
        bootstrap=bootstrap,
        region="us-east-1",
        tls_mode=s3.S3RequestTlsMode.DISABLED,
        credential_provider=credentials,
    )
    headers = HttpHeaders()
    headers.add("Host", endpoint)
    received = [0]

    def on_body(chunk, offset, **kwargs):
        received[0] += len(chunk)

    start = time.monotonic()
    request = s3.S3Request(
        client=client,
        type=s3.S3RequestType.GET_OBJECT,
        request=HttpRequest("GET", "/" + path, headers),
        on_body=on_body,
        credential_provider=credentials,
        region="us-east-1",
    )
    try:
        request.finished_future.result(timeout=600)
        outcome = f"ok, {received[0]} bytes"
    except Exception as error:  # awscrt reports every failure this way
        outcome = getattr(error, "name", repr(error))
    print(f"{time.monotonic() - start:.1f} s: {outcome}")


if __name__ == "__main__":
    main()
