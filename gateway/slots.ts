// Bounded queues of slots, one per name (an API key, a template): up to `max` calls hold a slot,
// up to `maxQueued` more wait in line for one, first come first served. A slot that frees goes
// straight to the oldest waiter, never to a call that arrives after it.

/** Gives a slot back; idempotent. */
export type Release = () => void;

interface Waiter {
  grant: (release: Release) => void;
}

/** The slots of one name: `running` taken, `waiting` in line. */
class Slots {
  running = 0;
  readonly waiting: Waiter[] = [];

  constructor(private readonly onIdle: () => void) {}

  /** A slot now, or undefined when all `max` are taken or others wait. */
  tryTake(max: number): Release | undefined {
    if (this.running >= max || this.waiting.length > 0) return undefined;
    this.running += 1;
    return this.releaser();
  }

  /** Whether no slot is free now and `maxQueued` calls already wait: one more is refused. */
  full(max: number, maxQueued: number): boolean {
    return (this.running >= max || this.waiting.length > 0) && this.waiting.length >= maxQueued;
  }

  /** Waits for a slot; `signal` aborting takes the call out of line and rejects with its reason. */
  wait(signal: AbortSignal): Promise<Release> {
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<Release>((resolve, reject) => {
      const onAbort = () => {
        const at = this.waiting.indexOf(waiter);
        if (at >= 0) this.waiting.splice(at, 1);
        if (this.idle()) this.onIdle();
        reject(signal.reason);
      };
      const waiter: Waiter = {
        grant: (release) => {
          signal.removeEventListener("abort", onAbort);
          resolve(release);
        },
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  idle(): boolean {
    return this.running === 0 && this.waiting.length === 0;
  }

  private releaser(): Release {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next !== undefined) {
        next.grant(this.releaser());
        return;
      }
      this.running -= 1;
      if (this.idle()) this.onIdle();
    };
  }
}

/** Slots by name; a name with nothing running or waiting is forgotten. */
export class SlotTable {
  private readonly slots = new Map<string, Slots>();

  private of(name: string): Slots {
    let slots = this.slots.get(name);
    if (slots === undefined) {
      const created = new Slots(() => {
        if (this.slots.get(name) === created && created.idle()) this.slots.delete(name);
      });
      this.slots.set(name, created);
      slots = created;
    }
    return slots;
  }

  /** A slot now, or undefined. */
  tryTake(name: string, max: number): Release | undefined {
    const slots = this.of(name);
    const taken = slots.tryTake(max);
    if (taken === undefined && slots.idle()) this.slots.delete(name);
    return taken;
  }

  /** A slot now, a wait for one, or undefined when `maxQueued` calls already wait. */
  take(
    name: string,
    max: number,
    maxQueued: number,
    signal: AbortSignal,
  ): Release | Promise<Release> | undefined {
    const slots = this.of(name);
    if (slots.full(max, maxQueued)) return undefined;
    return slots.tryTake(max) ?? slots.wait(signal);
  }

  /** Whether `take` would refuse a call of `name` now. */
  lineFull(name: string, max: number, maxQueued: number): boolean {
    return this.slots.get(name)?.full(max, maxQueued) ?? false;
  }

  running(name: string): number {
    return this.slots.get(name)?.running ?? 0;
  }

  queued(name: string): number {
    return this.slots.get(name)?.waiting.length ?? 0;
  }

  /** Calls waiting under every name. */
  totalQueued(): number {
    let total = 0;
    for (const slots of this.slots.values()) total += slots.waiting.length;
    return total;
  }
}
