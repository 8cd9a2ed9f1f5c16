#!/bin/sh
# The local CA and the broker's keystore for Kafka's SASL_SSL listener, made
# once with keytool (in the Kafka image) into the compose volumes:
#   /etc/kafka/secrets/kafka.keystore.p12  the broker's key and certificate
#                                          (for the names kafka and localhost)
#   /ca/ca.pem                             the CA clients trust
# A real cluster has certificates from the organisation's CA instead.
set -eu
secrets=/etc/kafka/secrets
ca_dir=/ca
if [ -f "$secrets/kafka.keystore.p12" ] && [ -f "$ca_dir/ca.pem" ]; then
    echo "certificates already made"
    exit 0
fi
pass="$KEYSTORE_PASSWORD"
work="$(mktemp -d)"
cd "$work"
keytool -genkeypair -alias ca -dname "CN=kafka-retry local CA" -ext bc:c -keyalg EC -groupname secp256r1 \
    -validity 825 -keystore ca.p12 -storetype PKCS12 -storepass "$pass"
keytool -exportcert -rfc -alias ca -keystore ca.p12 -storepass "$pass" > ca.pem
keytool -genkeypair -alias kafka -dname "CN=kafka" -keyalg EC -groupname secp256r1 \
    -validity 825 -keystore kafka.p12 -storetype PKCS12 -storepass "$pass"
keytool -certreq -alias kafka -keystore kafka.p12 -storepass "$pass" > kafka.csr
keytool -gencert -alias ca -keystore ca.p12 -storepass "$pass" -infile kafka.csr -outfile kafka.pem -rfc \
    -validity 825 -ext "SAN=dns:kafka,dns:localhost" -ext "EKU=serverAuth"
keytool -importcert -noprompt -alias ca -file ca.pem -keystore kafka.p12 -storepass "$pass"
keytool -importcert -noprompt -alias kafka -file kafka.pem -keystore kafka.p12 -storepass "$pass"
cp kafka.p12 "$secrets/kafka.keystore.p12"
cp ca.pem "$ca_dir/ca.pem"
# Kafka runs as its own user; the CA is public.
chmod 644 "$secrets/kafka.keystore.p12" "$ca_dir/ca.pem"
rm -rf "$work"
echo "certificates made"
