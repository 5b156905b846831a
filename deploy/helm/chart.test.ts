// The Helm chart (deploy/helm/sandfork) rendered by deploy/helm/render.ts, with its defaults and
// with each switch turned, and every object validated against the Kubernetes API's JSON schemas
// (kubernetes-models' generated validators), then the properties the deployment relies on.
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { ChartRenderer } from "./render.js";

const CHART = fileURLToPath(new URL("./sandfork", import.meta.url));
const RELEASE = { name: "prod", namespace: "sandfork" };
const chart = new ChartRenderer(CHART);

type K8sObject = Record<string, any>;

/** The schema validator of an object's apiVersion and kind (IoK8sApi<Group><Version><Kind>). */
async function schemaErrors(object: K8sObject): Promise<unknown[] | null> {
  const [group, version] = String(object.apiVersion).includes("/")
    ? String(object.apiVersion).split("/")
    : ["core", String(object.apiVersion)];
  const title = (s: string) => s.charAt(0).toUpperCase() + s.slice(1);
  const name = `IoK8sApi${title((group as string).split(".")[0] as string)}${title(version as string)}${object.kind}`;
  const module = (await import(`kubernetes-models/_schemas/${name}`)) as {
    validate: ((data: unknown) => boolean) & { errors?: unknown[] | null };
  };
  return module.validate(object) ? null : (module.validate.errors ?? ["invalid"]);
}

async function renderedValid(overrides: Record<string, unknown> = {}): Promise<K8sObject[]> {
  const objects = chart.objects(RELEASE, overrides);
  for (const { file, object } of objects)
    expect(
      await schemaErrors(object),
      `${file}: ${object.kind} ${(object as K8sObject).metadata?.name}`,
    ).toBeNull();
  return objects.map((o) => o.object);
}

const byKind = (objects: K8sObject[], kind: string) => objects.filter((o) => o.kind === kind);

describe("the Helm chart", () => {
  it("renders with its defaults into objects the Kubernetes schemas accept", async () => {
    const objects = await renderedValid();
    expect(objects.map((o) => o.kind).sort()).toEqual([
      "DaemonSet",
      "Deployment",
      "HorizontalPodAutoscaler",
      "NetworkPolicy",
      "NetworkPolicy",
      "PodDisruptionBudget",
      "Service",
    ]);
  });

  it("runs stateless gateways with probes, a disruption budget, CPU autoscaling and scrape annotations", async () => {
    const objects = await renderedValid();
    const [deployment] = byKind(objects, "Deployment") as [K8sObject];
    const pod = deployment.spec.template;
    const [gateway] = pod.spec.containers;
    expect(gateway.readinessProbe.httpGet).toEqual({ path: "/healthz", port: "http" });
    expect(gateway.livenessProbe.httpGet).toEqual({ path: "/healthz", port: "http" });
    expect(pod.metadata.annotations).toEqual({
      "prometheus.io/scrape": "true",
      "prometheus.io/port": "8787",
      "prometheus.io/path": "/metrics",
    });
    const env = Object.fromEntries(gateway.env.map((e: K8sObject) => [e.name, e]));
    expect(env.SANDFORK_RUNTIME.value).toBe("cluster");
    expect(env.DATABASE_URL.valueFrom.secretKeyRef).toEqual({
      name: "sandfork-database",
      key: "url",
    });
    expect(env.SANDFORK_TEMPLATES.value).toBe("python,node");
    // The autoscaler owns the replica count.
    expect(deployment.spec.replicas).toBeUndefined();
    const [hpa] = byKind(objects, "HorizontalPodAutoscaler") as [K8sObject];
    expect(hpa.spec.scaleTargetRef).toMatchObject({
      kind: "Deployment",
      name: deployment.metadata.name,
    });
    expect(hpa.spec.metrics[0].resource).toMatchObject({
      name: "cpu",
      target: { averageUtilization: 70 },
    });
    const [pdb] = byKind(objects, "PodDisruptionBudget") as [K8sObject];
    expect(pdb.spec.selector.matchLabels).toEqual(pod.metadata.labels);
    expect(deployment.spec.selector.matchLabels).toEqual(pod.metadata.labels);
    expect(gateway.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
    });
  });

  it("runs nodes on KVM hosts only, unprivileged, with /dev/kvm from a device plugin", async () => {
    const objects = await renderedValid();
    const [daemonSet] = byKind(objects, "DaemonSet") as [K8sObject];
    const pod = daemonSet.spec.template.spec;
    expect(pod.nodeSelector).toEqual({ "sandfork.dev/kvm": "true" });
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, supplementalGroups: [994] });
    const [node] = pod.containers;
    expect(node.securityContext).toEqual({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    });
    expect(node.resources.limits["devices.kubevirt.io/kvm"]).toBe("1");
    expect(pod.volumes.map((v: K8sObject) => v.name)).not.toContain("kvm");
    const env = Object.fromEntries(node.env.map((e: K8sObject) => [e.name, e]));
    expect(env.SANDFORK_NODE_ADDRESS.value).toBe("$(POD_IP):8790");
    expect(env.SANDFORK_NODE_ID.valueFrom.fieldRef.fieldPath).toBe("spec.nodeName");
    expect(env.SANDFORK_SESSIONS_ROOT).toBeUndefined();
  });

  it("lets only gateways reach the nodes' port", async () => {
    const objects = await renderedValid();
    const [, nodes] = byKind(objects, "NetworkPolicy") as [K8sObject, K8sObject];
    const [daemonSet] = byKind(objects, "DaemonSet") as [K8sObject];
    const [deployment] = byKind(objects, "Deployment") as [K8sObject];
    expect(nodes.spec.podSelector.matchLabels).toEqual(daemonSet.spec.template.metadata.labels);
    expect(nodes.spec.ingress).toEqual([
      {
        from: [{ podSelector: { matchLabels: deployment.spec.template.metadata.labels } }],
        ports: [{ port: 8790, protocol: "TCP" }],
      },
    ]);
  });

  it("renders valid objects with every switch turned", async () => {
    const objects = await renderedValid({
      gateway: {
        autoscaling: { enabled: false },
        podDisruptionBudget: { enabled: false },
        metrics: { scrapeAnnotations: false },
        replicas: 3,
      },
      node: {
        kvm: { mode: "privileged" },
        sessionsClaim: "sandfork-sessions",
        tolerations: [{ key: "kvm", operator: "Exists", effect: "NoSchedule" }],
      },
      networkPolicy: {
        gatewayIngressFrom: [{ namespaceSelector: { matchLabels: { name: "ingress" } } }],
      },
    });
    expect(byKind(objects, "HorizontalPodAutoscaler")).toEqual([]);
    expect(byKind(objects, "PodDisruptionBudget")).toEqual([]);
    const [deployment] = byKind(objects, "Deployment") as [K8sObject];
    expect(deployment.spec.replicas).toBe(3);
    expect(deployment.spec.template.metadata.annotations).toBeUndefined();
    const [daemonSet] = byKind(objects, "DaemonSet") as [K8sObject];
    const pod = daemonSet.spec.template.spec;
    expect(pod.containers[0].securityContext).toEqual({ privileged: true });
    expect(pod.volumes).toContainEqual({
      name: "kvm",
      hostPath: { path: "/dev/kvm", type: "CharDevice" },
    });
    expect(pod.volumes).toContainEqual({
      name: "sessions",
      persistentVolumeClaim: { claimName: "sandfork-sessions" },
    });
    expect(pod.tolerations).toHaveLength(1);
    const [gatewayPolicy] = byKind(objects, "NetworkPolicy") as [K8sObject];
    expect(gatewayPolicy.spec.ingress[0].from).toHaveLength(1);
    expect(
      byKind(await renderedValid({ networkPolicy: { enabled: false } }), "NetworkPolicy"),
    ).toEqual([]);
  });

  it("is caught by the schemas where an object is wrong, and by the renderer where a value is missing", async () => {
    const [deployment] = byKind(
      chart.objects(RELEASE).map((o) => o.object),
      "Deployment",
    ) as [K8sObject];
    deployment.spec.template.spec.containers[0].ports[0].containerPort = "http";
    expect(await schemaErrors(deployment)).not.toBeNull();
    expect(() =>
      chart.render(RELEASE, { gateway: { podDisruptionBudget: { maxUnavailable: null } } }),
    ).toThrow(/printing a missing value/);
    expect(() =>
      chart.render(RELEASE, { image: { tag: undefined, repository: { nested: 1 } } }),
    ).toThrow(/toYaml/);
  });
});
