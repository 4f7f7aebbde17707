/**
 * "Usage": my GPU-hours and CPU-hours, allocated against used, as plots drawn in SVG: paired
 * bars for the last 7 and 30 days, and one bar a day for the last 30 days
 * (`GET labfleet/api/usage/me`, through the session's proxy to the labfleet service).
 *
 * The SVGs stretch to the panel's width (`preserveAspectRatio="none"`); their text is HTML
 * beside them, so it keeps the UI font's size whatever the width.
 */
import * as React from 'react';

import { formatNumber } from '../format';
import type { FleetStore } from '../store';
import type { IMyUsage } from '../types';
import {
  formatDay,
  formatHours,
  hasSlotUsage,
  hasUsage,
  IUsageBars,
  IUsageDayBar,
  IUsageKind,
  niceMax,
  percent,
  USAGE_KINDS,
  usageDays,
  usagePeriodBars
} from '../usage';
import { Empty, ErrorNote } from './common';

type Series = 'allocated' | 'used';

const SERIES_HELP: Record<Series, string> = {
  allocated: 'allocated: what your sessions held, for as long as they ran',
  used: 'used: what your sessions really used of it'
};

/** Hours as a data attribute: a plain number (tests and the browser test read it). */
function hoursAttr(hours: number): string {
  return formatNumber(hours, 4);
}

/** One horizontal bar, `value` of `scale` long; a non-zero amount shows at least a sliver. */
function HBar(props: { value: number; scale: number; series: Series }): JSX.Element {
  const fraction = props.scale > 0 ? Math.min(Math.max(props.value / props.scale, 0), 1) : 0;
  const width = props.value > 0 ? Math.max(fraction * 100, 1) : 0;
  return (
    <svg
      className={`lf-usage-hbar lf-usage-${props.series}`}
      viewBox="0 0 100 10"
      preserveAspectRatio="none"
      aria-hidden="true"
      focusable="false"
    >
      <rect className="lf-usage-track" x={0} y={0} width={100} height={10} />
      <rect className="lf-usage-fill" x={0} y={0} width={width} height={10} />
    </svg>
  );
}

function periodSummary(kind: IUsageKind, b: IUsageBars): string {
  const eff = b.efficiency === null ? '' : ` (${percent(b.efficiency * 100)})`;
  const sessions = `${b.sessions} ${b.sessions === 1 ? 'session' : 'sessions'}`;
  return (
    `${kind.title}, ${b.title}: ${formatHours(b.used)} used of ` +
    `${formatHours(b.allocated)} allocated${eff}; ${sessions}`
  );
}

/** A period's pair of bars: allocated above, used below, on the kind's common scale. */
function PeriodBars(props: { kind: IUsageKind; bars: IUsageBars; scale: number }): JSX.Element {
  const { kind, bars: b, scale } = props;
  const id = `lf-usage-${kind.id}-${b.key}`;
  const summary = periodSummary(kind, b);
  return (
    <div
      className="lf-usage-period"
      role="img"
      aria-label={summary}
      title={summary}
      data-testid={id}
      data-allocated={hoursAttr(b.allocated)}
      data-used={hoursAttr(b.used)}
      data-sessions={b.sessions}
    >
      <span className="lf-usage-period-label">{b.label}</span>
      <HBar value={b.allocated} scale={scale} series="allocated" />
      <span className="lf-usage-value" data-testid={`${id}-allocated`}>
        {formatHours(b.allocated)}
      </span>
      <span className="lf-usage-eff" data-testid={`${id}-efficiency`}>
        {b.efficiency === null ? '' : `${percent(b.efficiency * 100)} used`}
      </span>
      <HBar value={b.used} scale={scale} series="used" />
      <span className="lf-usage-value lf-usage-value-used" data-testid={`${id}-used`}>
        {formatHours(b.used)}
      </span>
    </div>
  );
}

const DAY_W = 10;
const CHART_H = 48;

/** One bar a day: what was allocated, with what was used of it drawn over it. */
function DailyChart(props: { kind: IUsageKind; days: IUsageDayBar[] }): JSX.Element | null {
  const { kind, days } = props;
  if (!days.length) {
    return null;
  }
  const top = niceMax(Math.max(...days.map(d => Math.max(d.allocated, d.used))));
  const width = days.length * DAY_W;
  // Heights in px (the SVG is CHART_H px high); a non-zero amount shows at least 1 px.
  const height = (v: number) => (v > 0 ? Math.max((Math.min(v, top) / top) * CHART_H, 1) : 0);
  const first = formatDay(days[0].day);
  const last = formatDay(days[days.length - 1].day);
  const allocated = days.reduce((a, d) => a + d.allocated, 0);
  const used = days.reduce((a, d) => a + d.used, 0);
  const label =
    `${kind.title} per day, ${first} to ${last}: ${formatHours(allocated)} allocated, ` +
    `${formatHours(used)} used; the scale goes to ${formatHours(top)}`;
  return (
    <div className="lf-usage-daily" data-testid={`lf-usage-${kind.id}-daily`}>
      <div className="lf-usage-axis">
        <span>Per day</span>
        <span data-testid={`lf-usage-${kind.id}-daily-top`}>{formatHours(top)}</span>
      </div>
      <svg
        className="lf-usage-chart"
        viewBox={`0 0 ${width} ${CHART_H}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={label}
      >
        <line
          className="lf-usage-grid"
          x1={0}
          x2={width}
          y1={0.5}
          y2={0.5}
          vectorEffect="non-scaling-stroke"
        />
        <line
          className="lf-usage-grid"
          x1={0}
          x2={width}
          y1={CHART_H / 2}
          y2={CHART_H / 2}
          vectorEffect="non-scaling-stroke"
        />
        {days.map((d, i) => {
          const ha = height(d.allocated);
          const hu = height(d.used);
          return (
            <g
              key={`${d.day}-${i}`}
              data-testid="lf-usage-day"
              data-day={d.day}
              data-allocated={hoursAttr(d.allocated)}
              data-used={hoursAttr(d.used)}
            >
              <title>
                {`${formatDay(d.day)}: ${formatHours(d.allocated)} allocated, ` +
                  `${formatHours(d.used)} used`}
              </title>
              <rect className="lf-usage-hit" x={i * DAY_W} y={0} width={DAY_W} height={CHART_H} />
              <rect
                className="lf-usage-day-allocated"
                x={i * DAY_W + 1}
                y={CHART_H - ha}
                width={DAY_W - 2}
                height={ha}
              />
              <rect
                className="lf-usage-day-used"
                x={i * DAY_W + 1}
                y={CHART_H - hu}
                width={DAY_W - 2}
                height={hu}
              />
            </g>
          );
        })}
        <line
          className="lf-usage-baseline"
          x1={0}
          x2={width}
          y1={CHART_H - 0.5}
          y2={CHART_H - 0.5}
          vectorEffect="non-scaling-stroke"
        />
      </svg>
      <div className="lf-usage-axis">
        <span>{first}</span>
        <span>{last}</span>
      </div>
    </div>
  );
}

/** GPU-hours or CPU-hours: the periods' paired bars and the daily chart. */
function KindUsage(props: { usage: IMyUsage; kind: IUsageKind }): JSX.Element {
  const { usage, kind } = props;
  const bars = usagePeriodBars(usage, kind.slot);
  const scale = Math.max(0, ...bars.map(b => Math.max(b.allocated, b.used)));
  return (
    <div className="lf-usage-kind" data-testid={`lf-usage-${kind.id}`}>
      <div className="lf-subtitle">{kind.title}</div>
      {hasSlotUsage(usage, kind.slot) ? (
        <>
          <div className="lf-usage-periods">
            {bars.map(b => (
              <PeriodBars key={b.key} kind={kind} bars={b} scale={scale} />
            ))}
          </div>
          <DailyChart kind={kind} days={usageDays(usage, kind.slot)} />
        </>
      ) : (
        <Empty testid={`lf-usage-${kind.id}-none`}>No {kind.noun} in the last 30 days.</Empty>
      )}
    </div>
  );
}

function Swatch(props: { series: Series }): JSX.Element {
  return (
    <span className="lf-usage-key" title={SERIES_HELP[props.series]}>
      <svg
        className={`lf-usage-swatch lf-usage-${props.series}`}
        viewBox="0 0 10 10"
        aria-hidden="true"
        focusable="false"
      >
        <rect className="lf-usage-fill" x={0} y={0} width={10} height={10} />
      </svg>
      {props.series}
    </span>
  );
}

export function Usage(props: { store: FleetStore }): JSX.Element {
  const { store } = props;
  const u = store.data.usage;
  const error = store.errors.usage;
  return (
    <div className="lf-usage" data-testid="lf-usage">
      <ErrorNote message={error} testid="lf-error-usage" />
      {!u ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : !hasUsage(u) ? (
        <Empty testid="lf-usage-empty">
          No usage yet: the GPU- and CPU-hours of your sessions show here once they have run.
        </Empty>
      ) : (
        <div
          className={error ? 'lf-usage-plots lf-stale' : 'lf-usage-plots'}
          title={error ? 'the last numbers the service gave' : undefined}
        >
          <div className="lf-usage-legend">
            <Swatch series="allocated" />
            <Swatch series="used" />
          </div>
          {USAGE_KINDS.map(kind => (
            <KindUsage key={kind.id} usage={u} kind={kind} />
          ))}
          <div className="lf-usage-note">
            A GPU-hour is one whole GPU for an hour: half a GPU for an hour counts 0.5.
          </div>
        </div>
      )}
    </div>
  );
}
