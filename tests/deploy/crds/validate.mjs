// Validates custom resources against their CustomResourceDefinitions'
// OpenAPI schemas: Istio (networking.istio.io, security.istio.io), Gateway
// API (gateway.networking.k8s.io, the GRPCRoute Linkerd reads) and
// cert-manager (cert-manager.io). The validators are the ones the
// @kubernetes-models packages (package.json, pinned) generate from each
// project's published CRD YAML.
//
//   node tests/deploy/crds/validate.mjs < objects.json
//
// stdin: a JSON array of objects; stdout: a JSON array of the same length,
// null for a valid object, else why it is not. Exit status 0 unless the
// input cannot be read.
import { readFileSync } from "node:fs";

const PACKAGES = {
  "networking.istio.io": "@kubernetes-models/istio",
  "security.istio.io": "@kubernetes-models/istio",
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "cert-manager.io": "@kubernetes-models/cert-manager",
};

async function check(obj) {
  const [group, version] = String(obj?.apiVersion ?? "").split("/");
  const pkg = PACKAGES[group];
  if (!pkg || !version) {
    return `no CRD schema known for apiVersion ${obj?.apiVersion}`;
  }
  let model;
  try {
    model = (await import(`${pkg}/${group}/${version}/${obj.kind}`))[obj.kind];
  } catch {
    return `no CRD schema for ${obj.apiVersion} ${obj.kind}`;
  }
  try {
    new model(structuredClone(obj)).validate();
    return null;
  } catch (err) {
    return String(err?.message ?? err);
  }
}

const objects = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const obj of objects) {
  results.push(await check(obj));
}
process.stdout.write(JSON.stringify(results));
