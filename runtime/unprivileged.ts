// Who the daemon runs as when the gateway runs as root: the system user `sandfork-vmm` with the
// group that owns /dev/kvm, so that it holds /dev/kvm, reads the templates and owns its socket
// directory, and nothing else of root's (README, Security). Without that user the daemon runs as
// the gateway's own user, and a root gateway says so.
import { chown, readFile, stat } from "node:fs/promises";

export const DAEMON_USER = "sandfork-vmm";
const KVM_DEVICE = "/dev/kvm";

/** The uid of `name` in an /etc/passwd text, or undefined. */
export function uidOf(passwd: string, name: string): number | undefined {
  const line = passwd.split("\n").find((l) => l.split(":")[0] === name);
  const uid = line === undefined ? undefined : Number(line.split(":")[2]);
  return uid === undefined || !Number.isSafeInteger(uid) ? undefined : uid;
}

/**
 * As root: the daemon user and /dev/kvm's group, with `socketDir` handed to that user (the
 * daemon creates its socket there); otherwise undefined (run as the current user).
 */
export async function daemonUser(
  socketDir: string,
  log: (line: string) => void,
): Promise<{ uid: number; gid: number } | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const uid = uidOf(await readFile("/etc/passwd", "utf8").catch(() => ""), DAEMON_USER);
  if (uid === undefined) {
    log(
      `running sandfork-vmm as root: create the system user '${DAEMON_USER}' to run it unprivileged (README, Security)`,
    );
    return undefined;
  }
  const gid = (await stat(KVM_DEVICE).catch(() => undefined))?.gid ?? uid;
  await chown(socketDir, uid, gid);
  return { uid, gid };
}
