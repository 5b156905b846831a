// What an execution costs, in integer billing units ("credits"). A template's price is a fixed
// amount per execution plus unitsPerSecond for each second of wall time, counted by the
// millisecond and rounded up to a whole unit, plus unitsPerNetworkMib for each MiB of network
// bytes received and sent, counted by the byte and rounded up. The worst case for a request (its
// full timeout, and its network grant's byte cap) is what gets reserved.

export interface TemplatePrice {
  baseUnits: number;
  unitsPerSecond: number;
  /** Per MiB of network bytes in and out; absent: network traffic is free. */
  unitsPerNetworkMib?: number;
}

const MIB = 1024 * 1024;

export interface Pricing {
  /** Display name of one billing unit. */
  unitName: string;
  /** Per-template prices; "*" applies to every template without its own entry. */
  templates: Record<string, TemplatePrice>;
}

export const DEFAULT_PRICING: Pricing = {
  unitName: "credit",
  templates: { "*": { baseUnits: 1, unitsPerSecond: 10, unitsPerNetworkMib: 1 } },
};

function isPrice(value: unknown): value is TemplatePrice {
  if (typeof value !== "object" || value === null) return false;
  const { baseUnits, unitsPerSecond, unitsPerNetworkMib } = value as Record<string, unknown>;
  const unit = (n: unknown) => typeof n === "number" && Number.isSafeInteger(n) && n >= 0;
  return (
    unit(baseUnits) &&
    unit(unitsPerSecond) &&
    (unitsPerNetworkMib === undefined || unit(unitsPerNetworkMib))
  );
}

/** Parses SANDFORK_PRICING: {"unitName"?: string, "templates": {name: {baseUnits, unitsPerSecond, unitsPerNetworkMib?}}}. */
export function parsePricing(json: string): Pricing {
  const parsed: unknown = JSON.parse(json);
  if (typeof parsed !== "object" || parsed === null)
    throw new Error("pricing must be a JSON object");
  const { unitName, templates } = parsed as Record<string, unknown>;
  if (typeof templates !== "object" || templates === null)
    throw new Error("pricing.templates must be an object");
  for (const [name, price] of Object.entries(templates)) {
    if (!isPrice(price))
      throw new Error(
        `pricing.templates.${name} needs integer baseUnits, unitsPerSecond (and unitsPerNetworkMib, if given) >= 0`,
      );
  }
  return {
    unitName: typeof unitName === "string" ? unitName : DEFAULT_PRICING.unitName,
    templates: templates as Record<string, TemplatePrice>,
  };
}

export function priceOf(pricing: Pricing, template: string): TemplatePrice {
  const price = pricing.templates[template] ?? pricing.templates["*"];
  if (price === undefined) throw new Error(`no price configured for template ${template}`);
  return price;
}

/** Integer cost of `wallMs` milliseconds: base + ceil(wallMs * unitsPerSecond / 1000). */
export function costUnits(price: TemplatePrice, wallMs: number): number {
  const ms = Math.max(0, Math.ceil(wallMs));
  return price.baseUnits + Math.ceil((ms * price.unitsPerSecond) / 1000);
}

/** Integer cost of `bytes` network bytes: ceil(bytes * unitsPerNetworkMib / MiB), exact for any safe count. */
export function networkUnits(price: TemplatePrice, bytes: number): number {
  const perMib = price.unitsPerNetworkMib ?? 0;
  const whole = Math.floor(bytes / MIB);
  return whole * perMib + Math.ceil(((bytes - whole * MIB) * perMib) / MIB);
}
