// The PostgreSQL wire-protocol messages of one call of a prepared statement on PGlite, built and
// read here rather than by PGlite's general codec: its serializer grows a buffer field by field
// and its parser makes an object per message, a share of billing's CPU on PGlite worth saving;
// db/prepared.ts takes the raw response through PGlite's raw-data stream, which its parser does
// not see. Only the success path is read here; a response with an error in it is left to
// PGlite's parser, so the error thrown is the one its own query() would throw.
// Message layouts: https://www.postgresql.org/docs/current/protocol-message-formats.html

const EXECUTE_AND_SYNC = Uint8Array.of(
  // Execute: the unnamed portal, no row limit.
  0x45,
  0,
  0,
  0,
  9,
  0,
  0,
  0,
  0,
  0,
  // Sync: ends the implicit transaction (commits it).
  0x53,
  0,
  0,
  0,
  4,
);

/** Bind (every parameter and result column as text), Execute and Sync of `statement`. */
export function bindExecuteSync(statement: string, params: readonly (string | null)[]): Buffer {
  const nameBytes = Buffer.byteLength(statement);
  const valueBytes = params.map((p) => (p === null ? 0 : Buffer.byteLength(p)));
  // length, portal "\0", statement name "\0", no format codes (all text), parameter count,
  // each parameter's length and bytes, no result format codes (all text).
  const bindLength = 4 + 1 + nameBytes + 1 + 2 + 2 + valueBytes.reduce((n, b) => n + 4 + b, 0) + 2;
  const out = Buffer.allocUnsafe(1 + bindLength + EXECUTE_AND_SYNC.length);
  let at = out.writeUInt8(0x42, 0);
  at = out.writeInt32BE(bindLength, at);
  at = out.writeUInt8(0, at);
  at += out.write(statement, at);
  at = out.writeUInt8(0, at);
  at = out.writeInt16BE(0, at);
  at = out.writeInt16BE(params.length, at);
  params.forEach((param, i) => {
    if (param === null) {
      at = out.writeInt32BE(-1, at);
      return;
    }
    at = out.writeInt32BE(valueBytes[i] as number, at);
    at += out.write(param, at);
  });
  at = out.writeInt16BE(0, at);
  out.set(EXECUTE_AND_SYNC, at);
  return out;
}

export interface StatementResponse {
  /** The result's column names when the response described them (RowDescription, or [] for NoData). */
  columns: string[] | undefined;
  rows: (string | null)[][];
  /** An ErrorResponse came: read the response with PGlite's parser for the error. */
  failed: boolean;
}

/** The columns and text rows of a response to (Parse, Describe,) Bind, Execute, Sync. */
export function readResponse(bytes: Uint8Array): StatementResponse {
  const data = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const response: StatementResponse = { columns: undefined, rows: [], failed: false };
  let at = 0;
  while (at + 5 <= data.length) {
    const type = data[at] as number;
    const end = at + 1 + data.readInt32BE(at + 1);
    // A message's length counts itself (4 bytes) and must end within the response.
    if (end < at + 5 || end > data.length)
      throw new Error("PGlite answered a malformed protocol message");
    let p = at + 5;
    if (type === 0x45 /* E: ErrorResponse */) {
      response.failed = true;
    } else if (type === 0x6e /* n: NoData */) {
      response.columns = [];
    } else if (type === 0x54 /* T: RowDescription */) {
      const columns: string[] = [];
      const count = data.readInt16BE(p);
      p += 2;
      for (let i = 0; i < count; i++) {
        const nameEnd = data.indexOf(0, p);
        if (nameEnd < 0 || nameEnd + 19 > end)
          throw new Error("PGlite answered a malformed protocol message");
        columns.push(data.toString("utf8", p, nameEnd));
        // table oid, column number, type oid, type size, type modifier, format code
        p = nameEnd + 1 + 18;
      }
      response.columns = columns;
    } else if (type === 0x44 /* D: DataRow */) {
      const count = data.readInt16BE(p);
      p += 2;
      const row: (string | null)[] = [];
      for (let i = 0; i < count; i++) {
        const length = data.readInt32BE(p);
        p += 4;
        if (length < 0) {
          row.push(null);
        } else {
          if (p + length > end) throw new Error("PGlite answered a malformed protocol message");
          row.push(data.toString("utf8", p, p + length));
          p += length;
        }
      }
      response.rows.push(row);
    }
    at = end;
  }
  return response;
}
