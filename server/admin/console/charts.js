/* Small line charts on <canvas>, drawn by hand (no library, nothing fetched from elsewhere).
 *
 *   const chart = new LineChart(canvas, {series: [{key: "rate_in", label: "in", color: "#2563eb"}],
 *                                        format: v => v.toFixed(1)});
 *   chart.update(points);     // points: [{t: unix ms, rate_in: 1.5, ...}, ...] oldest first
 *
 * The y axis starts at 0 and ends at a rounded maximum; the x axis spans the points' time range.
 */
"use strict";

class LineChart {
  constructor(canvas, options) {
    this.canvas = canvas;
    this.series = options.series;
    this.format = options.format || LineChart.number;
    this.points = [];
  }

  update(points) {
    this.points = points || [];
    this.draw();
  }

  /* 0.25, 1.5, 12, 1,200: as many decimals as a tick needs, at most two */
  static number(v) {
    return Number.isInteger(v) ? v.toLocaleString("en") : String(Math.round(v * 100) / 100);
  }

  static niceMax(value) {
    if (!(value > 0)) return 1;
    const exp = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 2.5, 5, 10]) {
      if (value <= step * exp) return step * exp;
    }
    return 10 * exp;
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 400;
    const height = canvas.clientHeight || 160;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const left = 56, right = 8, top = 18, bottom = 20;
    const plotW = width - left - right, plotH = height - top - bottom;
    const pts = this.points;
    let max = 0;
    for (const p of pts) for (const s of this.series) max = Math.max(max, Number(p[s.key]) || 0);
    max = LineChart.niceMax(max);
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e5e7eb";
    ctx.fillStyle = "#6b7280";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const y = top + plotH - (plotH * i) / 4;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y) + 0.5);
      ctx.lineTo(left + plotW, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(this.format((max * i) / 4), left - 6, y);
    }
    // legend
    ctx.textAlign = "left";
    let lx = left;
    for (const s of this.series) {
      ctx.fillStyle = s.color;
      ctx.fillRect(lx, 4, 10, 10);
      ctx.fillStyle = "#374151";
      ctx.fillText(s.label, lx + 14, 9);
      lx += 22 + ctx.measureText(s.label).width;
    }
    if (pts.length < 2) {
      ctx.fillStyle = "#9ca3af";
      ctx.textAlign = "center";
      ctx.fillText(pts.length ? "collecting…" : "no data yet", left + plotW / 2, top + plotH / 2);
      return;
    }
    const t0 = pts[0].t, t1 = pts[pts.length - 1].t;
    const span = Math.max(1, t1 - t0);
    ctx.fillStyle = "#6b7280";
    ctx.textAlign = "left";
    ctx.fillText(`${Math.round(span / 1000)} s`, left, height - 8);
    ctx.textAlign = "right";
    ctx.fillText("now", left + plotW, height - 8);
    for (const s of this.series) {
      ctx.strokeStyle = s.color;
      ctx.lineWidth = 2;
      ctx.beginPath();
      pts.forEach((p, i) => {
        const x = left + (plotW * (p.t - t0)) / span;
        const y = top + plotH - (plotH * (Number(p[s.key]) || 0)) / max;
        if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  }
}

window.LineChart = LineChart;
