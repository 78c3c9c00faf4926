#!/usr/bin/env bash
# TLS for the injection webhook WITHOUT cert-manager: a private CA and a serving
# certificate for the injector's Service, made with openssl.
#
#   deploy/k8s/tls/self-signed.sh OUT_DIR            # write the files only
#   deploy/k8s/tls/self-signed.sh OUT_DIR --apply    # also create the Secret and patch
#                                                    # the webhook's caBundle (kubectl)
#
# Writes OUT_DIR/{ca.crt,ca.key,tls.crt,tls.key,cabundle-patch.json}. Keep ca.key
# private (or delete it: it is only needed to sign a renewal). The certificate is valid
# for DAYS days (default 365): re-run before it expires; the injector reloads the
# Secret's files without a restart. Use it with the base minus certificate.yaml.
set -euo pipefail

out="${1:?usage: $0 OUT_DIR [--apply]}"
apply="${2:-}"
namespace="${NAMESPACE:-gym-telemetry}"
service="${SERVICE:-gym-telemetry-injector}"
secret="${SECRET:-gym-telemetry-injector-tls}"
webhook="${WEBHOOK:-gym-telemetry-injector}"
days="${DAYS:-365}"

mkdir -p "$out"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days "$days" \
  -subj "/CN=gym-telemetry-injector-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/tls.key" -out "$out/tls.csr" \
  -subj "/CN=$service.$namespace.svc" 2>/dev/null
printf '%s\n' \
  "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth" \
  "subjectAltName=DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local" \
  >"$out/tls.ext"
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
  -CAcreateserial -out "$out/tls.crt" -days "$days" -extfile "$out/tls.ext" 2>/dev/null
rm -f "$out/tls.csr" "$out/tls.ext" "$out/ca.srl"

ca_bundle="$(base64 <"$out/ca.crt" | tr -d '\n')"
printf '[{"op":"add","path":"/webhooks/0/clientConfig/caBundle","value":"%s"},{"op":"add","path":"/webhooks/1/clientConfig/caBundle","value":"%s"}]\n' \
  "$ca_bundle" "$ca_bundle" >"$out/cabundle-patch.json"
echo "wrote $out/{ca.crt,ca.key,tls.crt,tls.key,cabundle-patch.json}"

if [ "$apply" = "--apply" ]; then
  kubectl -n "$namespace" create secret tls "$secret" \
    --cert="$out/tls.crt" --key="$out/tls.key" --dry-run=client -o yaml | kubectl apply -f -
  kubectl patch mutatingwebhookconfiguration "$webhook" --type=json \
    --patch-file "$out/cabundle-patch.json"
fi
