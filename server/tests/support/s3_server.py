"""An S3 API server for tests: moto's, on a loopback port of its choosing.

Creates the bucket named by the first argument, prints the port on one line,
then serves until its standard input closes (the test holding the other end
went away), so it never outlives the test.
"""

import sys

from moto.server import ThreadedMotoServer


def main() -> None:
    bucket = sys.argv[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server._server.server_port
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    s3.create_bucket(Bucket=bucket)
    print(port, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
