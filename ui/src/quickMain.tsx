import { render } from 'preact';
import { QuickChat } from './components/QuickChat';
import './styles.css';

render(<QuickChat />, document.getElementById('quick')!);
