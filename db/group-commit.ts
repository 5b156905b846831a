// Group commit: the items submitted while one batch's statement is in flight wait for it and then
// go together as the next batch, one statement (one round trip, one commit) for all of them. A
// batch is taken in the event loop's check phase (setImmediate), after the I/O callbacks that
// were ready: with embedded PGlite a statement runs synchronously on this thread, so requests and
// daemon answers that arrived meanwhile are only read then, and taking the next batch at once
// would find each one alone. A lone caller waits for that one turn of the loop, no timer and no
// one else. Each submitter's promise settles only when its batch has committed; a batch that
// fails rejects every one of its items with that error.
export type BatchRunner<I, O> = (items: I[]) => Promise<O[]>;

interface Pending<I, O> {
  item: I;
  resolve(output: O): void;
  reject(error: unknown): void;
}

export class GroupCommit<I, O> {
  private queue: Pending<I, O>[] = [];
  private inFlight = false;

  /** `run` answers one output per item, in order. `maxBatch` bounds one statement's size. */
  constructor(
    private readonly run: BatchRunner<I, O>,
    private readonly maxBatch = 64,
  ) {}

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      if (!this.inFlight) {
        this.inFlight = true;
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, this.maxBatch);
      try {
        const outputs = await this.run(batch.map((p) => p.item));
        if (outputs.length !== batch.length)
          throw new Error(`a batch of ${batch.length} answered ${outputs.length} outputs`);
        for (const [i, p] of batch.entries()) p.resolve(outputs[i] as O);
      } catch (error) {
        for (const p of batch) p.reject(error);
      }
      // Submitted while this batch ran: take it next turn, with what this turn's I/O callbacks
      // add. With none queued the group is done (a lone caller's batch costs no second turn of
      // the loop); whoever submits next starts it again, in the same turn as the rest of its I/O.
      if (this.queue.length === 0) break;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    this.inFlight = false;
  }
}
