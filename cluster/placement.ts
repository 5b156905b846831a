// Which node runs a call: of the nodes that can (a fresh heartbeat, a connection, the template),
// the less loaded of two picked at random ("the power of two choices": nearly as even as asking
// every node, without every gateway herding onto the one that looked idlest a moment ago).

export interface Candidate {
  id: string;
  /** Executions it runs or queues: its last heartbeat's count plus this gateway's since. */
  load: number;
  /** Executions it runs at once. */
  capacity: number;
}

/** The chosen candidate, or undefined when there is none. `random` returns [0, 1). */
export function pickNode<T extends Candidate>(
  candidates: readonly T[],
  random: () => number = Math.random,
): T | undefined {
  if (candidates.length <= 1) return candidates[0];
  const first = Math.floor(random() * candidates.length);
  let second = Math.floor(random() * (candidates.length - 1));
  if (second >= first) second += 1;
  const a = candidates[first] as T;
  const b = candidates[second] as T;
  return a.load / a.capacity <= b.load / b.capacity ? a : b;
}
