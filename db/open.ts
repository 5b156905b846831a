// The composition root of the billing database: a connection (db/client.ts) with the PGlite
// record journal wired to billing's fold and lookup, so that neither depends on the other.
import { recordedIds } from "./billing.js";
import { type DatabaseLocation, type OpenDatabase, openConnection } from "./client.js";
import { recordAll } from "./leases.js";

/** Opens and migrates the database at `location`; on PGlite, replays its record journal. */
export function openDatabase(location: DatabaseLocation): Promise<OpenDatabase> {
  return openConnection(location, {
    fold: async (db, records) => {
      await recordAll(db, records, { waitForJournal: false });
    },
    recorded: (db, ids) => recordedIds(db, ids),
  });
}
